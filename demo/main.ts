/**
 * `npm start`: the demo on an embedded Postgres. It starts (or reuses) a PostgreSQL whose data
 * lives under `.awa/` in the checkout, applies Awa's migrations and prints the schema version.
 * `DATABASE_URL` points it at another server instead. Ctrl-C stops it, and the embedded server
 * too if this process started it.
 */
import { fileURLToPath } from "node:url"
import { Migrations } from "@awa/sql"
import { EmbeddedPostgres } from "@awa/testing"
import { NodeRuntime } from "@effect/platform-node"
import { PgClient } from "@effect/sql-pg"
import { Console, Effect, Redacted } from "effect"

const dataRoot = fileURLToPath(new URL("../.awa/", import.meta.url))

const server = Effect.acquireRelease(
  Effect.promise(() =>
    EmbeddedPostgres.resolve(process.env, () => EmbeddedPostgres.startPersistent(dataRoot))
  ),
  (s) =>
    Effect.promise(() => s.stop()).pipe(
      Effect.andThen(s.started ? Console.log("embedded Postgres stopped") : Effect.void)
    )
)

const program = Effect.gen(function* () {
  const pg = yield* server
  yield* Console.log(pg.dataDir ? `Postgres: embedded, data in ${pg.dataDir}` : "Postgres: DATABASE_URL")
  const client = PgClient.layer({
    url: Redacted.make(pg.url),
    maxConnections: 4,
    applicationName: "awa-demo"
  })
  yield* Effect.gen(function* () {
    const result = yield* Migrations.migrate()
    yield* Console.log(
      `awa schema "${result.schema}" at version ${result.to} (applied now: ${result.applied.length === 0 ? "none" : result.applied.join(", ")})`
    )
    yield* Console.log("demo running; press Ctrl-C to stop")
    return yield* Effect.never
  }).pipe(Effect.provide(client))
}).pipe(Effect.scoped)

NodeRuntime.runMain(program)
