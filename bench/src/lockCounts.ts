/**
 * Lock-table entries per storage call (issue 13 item 4, ADR 0021, docs/postgres-support.md):
 * runs each call inside a transaction on one session and counts that backend's `pg_locks` rows
 * right after it, before the commit releases them.
 *
 *   DATABASE_URL=postgres://…/postgres node bench/src/lockCounts.ts
 *
 * Each call runs once before it is measured, so its plans are cached as in a worker's session
 * (the first call of a session also locks what planning opened). Columns: all `pg_locks` rows of
 * the backend; those outside the fast path (what takes room in the shared lock table, 64 ×
 * max_connections entries on a stock server); the distinct objects among those (pg_locks shows one
 * row per mode, the shared table holds one entry per object and backend); advisory locks.
 *
 * Output: one table on stdout; no thresholds.
 */
import { Migrations } from "@awa/sql"
import { PgQueueStorage, QueueStorage } from "@awa/storage"
import { NodeRuntime } from "@effect/platform-node"
import { PgClient } from "@effect/sql-pg"
import { Console, Effect, Layer, Redacted } from "effect"
import { SqlClient } from "effect/sql"
import { acquireServer, createDatabase, databaseName, dropDatabase, table, withClient } from "./lib.ts"

interface Count {
  readonly all: number
  readonly shared: number
  readonly objects: number
  readonly advisory: number
}

const countLocks = Effect.flatMap(SqlClient.SqlClient, (sql) =>
  Effect.map(
    sql<Count>`
      SELECT count(*)::int AS all, count(*) FILTER (WHERE NOT fastpath)::int AS shared,
             count(DISTINCT concat_ws('/', locktype, database, relation, page, tuple, virtualxid, transactionid::text, classid, objid, objsubid))
               FILTER (WHERE NOT fastpath)::int AS objects,
             count(*) FILTER (WHERE locktype = 'advisory')::int AS advisory
      FROM pg_locks WHERE pid = pg_backend_pid()`,
    (rows) => rows[0]!
  )
)

/**
 * `call` once to warm the session's plans, then again inside a transaction, counting its locks.
 * `prepare` (a claim, for finalize) runs before each, outside the counted transaction.
 */
const measure = <I, E, R, E2, R2>(
  prepare: Effect.Effect<I, E2, R2>,
  call: (input: I) => Effect.Effect<unknown, E, R>
) =>
  Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    yield* call(yield* prepare)
    const input = yield* prepare
    return yield* sql.withTransaction(Effect.andThen(call(input), countLocks))
  })

const complete = (claimed: ReadonlyArray<{ jobId: bigint; runLease: bigint }>) =>
  claimed.map((c) => ({ jobId: c.jobId, runLease: c.runLease, outcome: { _tag: "Complete" as const } }))

const calls = Effect.gen(function* () {
  const storage = yield* QueueStorage
  const sql = yield* SqlClient.SqlClient
  const claimOf = (queue: string, max: number) => ({ queue, max, deadlineMs: 0, agingIntervalMs: 0 })
  const fill = (queue: string, n: number) =>
    storage.enqueueMany(Array.from({ length: n }, (_, k) => ({ kind: "locks", queue, args: { k } })))
  yield* fill("claim", 2000)
  yield* fill("fin", 4 * 512 + 40)
  yield* fill("hb", 1000)
  const rows: Array<readonly [string, Count]> = []
  const none = Effect.void
  rows.push(["claim(1)", yield* measure(none, () => storage.claim(claimOf("claim", 1)))])
  rows.push(["claim(512)", yield* measure(none, () => storage.claim(claimOf("claim", 512)))])
  for (const n of [10, 512])
    rows.push([
      `finalize(${n})`,
      yield* measure(storage.claim(claimOf("fin", n)), (claimed) => storage.finalizeMany(complete(claimed)))
    ])
  const held = yield* storage.claim(claimOf("hb", 500))
  rows.push([
    "heartbeat(500)",
    yield* measure(none, () =>
      storage.heartbeatMany(held.map((c) => ({ jobId: c.jobId, runLease: c.runLease })))
    )
  ])
  rows.push([
    "jobs view, one job_id",
    yield* measure(none, () => sql`SELECT * FROM awa.jobs WHERE job_id = ${held[0]!.jobId}`)
  ])
  // (migration 0027; a schema before it has only drain_queue, one transaction for the whole queue)
  const [batched] = yield* sql<{
    yes: boolean
  }>`SELECT to_regproc('awa.drain_queue_batch') IS NOT NULL AS yes`
  rows.push(
    batched!.yes
      ? [
          "drain_queue_batch(500)",
          yield* measure(
            fill("drain", 500),
            () => sql`SELECT awa.drain_queue_batch('drain', 'locks', 500, 1000000000)`
          )
        ]
      : [
          "drain_queue (500 jobs)",
          yield* measure(fill("drain", 500), () => sql`SELECT awa.drain_queue('drain', 'locks')`)
        ]
  )
  return rows
})

const program = Effect.gen(function* () {
  const server = yield* acquireServer
  const version = yield* withClient(server.url, (sql) =>
    Effect.map(
      sql<{ v: string; locks: string; conns: string }>`
        SELECT current_setting('server_version') AS v, current_setting('max_locks_per_transaction') AS locks,
               current_setting('max_connections') AS conns`,
      (rows) => rows[0]!
    )
  )
  const name = databaseName("awa_locks")
  const url = yield* createDatabase(server.url, name)
  const rows = yield* Effect.gen(function* () {
    const applied = yield* Migrations.migrate()
    yield* Console.log(
      `PostgreSQL ${version.v}, max_locks_per_transaction ${version.locks}, max_connections ${version.conns}; schema version ${applied.to}`
    )
    return yield* calls
  }).pipe(
    Effect.provide(
      PgQueueStorage.layer().pipe(
        Layer.provideMerge(
          PgClient.layer({ url: Redacted.make(url), maxConnections: 1, applicationName: "awa-locks" })
        )
      )
    ),
    Effect.ensuring(dropDatabase(server.url, name))
  )
  yield* Console.log(
    table(
      ["call (plan cached)", "pg_locks rows", "not fast-path", "distinct objects", "advisory"],
      rows.map(([call, c]) => [call, c.all, c.shared, c.objects, c.advisory])
    )
  )
}).pipe(Effect.scoped)

NodeRuntime.runMain(program)
