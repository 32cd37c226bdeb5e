/**
 * `@awa/effect`: the package an application installs. It re-exports the public API of
 * `@awa/core` (errors, job definitions, job states, new-job checks), `@awa/storage` (the
 * `QueueStorage` service and its Postgres and in-memory layers), `@awa/runtime` (`Awa`,
 * `AwaClient`, `Handler`, `Worker`, `Cron`, the Promise facade) and the migrations of `@awa/sql`,
 * so one import line and one dependency cover a job from definition to worker.
 *
 * ```ts
 * import { Awa, AwaClient, Handler, Job } from "@awa/effect"
 * ```
 *
 * The in-memory engine for tests is also under `@awa/effect/simulation`.
 */
export * from "@awa/core"
export * from "@awa/runtime"
export { Migrations } from "@awa/sql"
export * from "@awa/storage"
export * as CallbackRoutes from "./CallbackRoutes.ts"
