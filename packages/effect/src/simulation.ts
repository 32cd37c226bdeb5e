/**
 * `@awa/effect/simulation`: the deterministic in-memory engine, for testing handlers and
 * producers without Postgres. Drive time with `TestClock` from `effect/testing`.
 *
 * ```ts
 * import * as Simulation from "@awa/effect/simulation"
 * Effect.provide(Awa.worker({ ... }).pipe(Layer.provideMerge(Simulation.layer())))
 * ```
 *
 * `layer` is `Awa.layerSim`: the client, queue storage, cron storage, a silent signal source and
 * an in-memory leader lock. The pieces are exported for applications that compose their own.
 */
import { Awa } from "@awa/runtime"

export { CronStorage, LeaderLock, SimQueueStorage, StorageSignals } from "@awa/storage"

/** The client and every storage service in memory; deterministic under `TestClock`. */
export const layer: typeof Awa.layerSim = Awa.layerSim
