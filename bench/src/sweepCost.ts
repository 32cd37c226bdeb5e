/**
 * What rescue's sweeps and prune's young-attempt test cost on a large slot, measured inside one
 * backend (the method of claimCost.ts): the figures behind docs/benchmarks.md, "Claim spans". In a
 * fresh database it enqueues one backlog into one ring slot, claims all of it in calls of
 * `--batch` with a deadline that has passed by the time it is measured, completes all but the
 * last `--open` attempts, and seals the slot. Then it times, each call rolled back in a
 * subtransaction so that every call finds the same rows:
 *
 * - the stale sweep with a cutoff of now (every claim is older: it visits them all) and with a
 *   cutoff an hour ago (nothing is older: the usual tick);
 * - the deadline sweep (every deadline has passed: it visits them all);
 * - a prune tick on the sealed slot, answered by its young-attempt test (its newest claims are open).
 *
 *   node --conditions=@awa/source bench/src/sweepCost.ts [--jobs 100000] [--batch 500] [--open 10] [--rounds 5] [--calls 20]
 *   DATABASE_URL=postgres://…/postgres node --conditions=@awa/source bench/src/sweepCost.ts   # any server
 */
import { Awa } from "@awa/runtime"
import { QueueStorage } from "@awa/storage"
import { PgClient } from "@effect/sql-pg"
import { Effect, Layer, Redacted, References } from "effect"
import {
  acquireServerAt,
  costTable,
  createDatabase,
  databaseName,
  intArg,
  rolledBackTimer,
  withClient
} from "./lib.ts"

const jobs = intArg("--jobs", 100_000)
const batch = intArg("--batch", 500)
const open = intArg("--open", 10)
const rounds = intArg("--rounds", 5)
const calls = intArg("--calls", 20)

const queue = "sweep_cost"

/** The calls timed: a label and the statement one loop iteration runs. */
const probes: ReadonlyArray<readonly [string, string]> = [
  ["rescue stale, cutoff now (visits every claim)", `SELECT count(*) FROM awa.rescue('stale', 0, 500)`],
  ["rescue stale, cutoff 1 h ago (nothing older)", `SELECT count(*) FROM awa.rescue('stale', 3600000, 500)`],
  ["rescue deadline (every deadline passed)", `SELECT count(*) FROM awa.rescue('deadline', 0, 500)`],
  [
    "prune tick, young attempts",
    `SELECT outcome FROM awa.prune_queue(5000, 86400000, 86400000, 86400000, 600000, 0, 1000, 0)`
  ]
]

/** The backlog, claimed in calls of `batch` with a 1 ms deadline, all closed but the newest `open`. */
const load = (url: string) =>
  Effect.gen(function* () {
    const storage = yield* QueueStorage
    for (let from = 0; from < jobs; from += 5_000)
      yield* storage.enqueueMany(
        Array.from({ length: Math.min(5_000, jobs - from) }, (_, i) => ({
          kind: "sweep",
          queue,
          args: { n: from + i }
        }))
      )
    const claimed: Array<{ readonly jobId: bigint; readonly runLease: bigint }> = []
    for (;;) {
      const got = yield* storage.claim({ queue, max: batch, deadlineMs: 1, agingIntervalMs: 0 })
      if (got.length === 0) break
      claimed.push(...got)
    }
    const closing = claimed.slice(0, Math.max(0, claimed.length - open))
    for (let from = 0; from < closing.length; from += 1_000)
      yield* storage.finalizeMany(
        closing
          .slice(from, from + 1_000)
          .map((c) => ({ jobId: c.jobId, runLease: c.runLease, outcome: { _tag: "Complete" as const } }))
      )
    yield* storage.rotateWhenDue({ minRows: 1, maxAgeMs: 0 })
  }).pipe(
    Effect.provide(
      Awa.layerPg({ migrateOnStart: true }).pipe(
        Layer.provideMerge(PgClient.layer({ url: Redacted.make(url), maxConnections: 4 })),
        Layer.provideMerge(Layer.succeed(References.MinimumLogLevel, "Warn"))
      )
    )
  )

const measure = (url: string) =>
  withClient(url, (sql) =>
    Effect.gen(function* () {
      yield* sql.unsafe("VACUUM ANALYZE").unprepared
      yield* sql.unsafe(rolledBackTimer).unprepared
      const samples = new Map<string, Array<number>>(probes.map(([label]) => [label, []]))
      for (const [, statement] of probes) yield* sql`SELECT pg_temp.awa_rolled_back_cost(${statement}, 2)`
      for (let r = 0; r < rounds; r++)
        for (const [label, statement] of probes) {
          const [row] = yield* sql<{
            us: number
          }>`SELECT pg_temp.awa_rolled_back_cost(${statement}, ${calls}) AS us`
          samples.get(label)!.push(Number(row!.us))
        }
      return samples
    })
  )

const program = Effect.gen(function* () {
  const server = yield* acquireServerAt(process.env.DATABASE_URL)
  const url = yield* createDatabase(server.url, databaseName("awa_sweep_cost"))
  yield* load(url)
  const samples = yield* measure(url)
  console.log(
    `sweep cost in one backend: ${jobs.toLocaleString("en-US")} claims in one slot (calls of ${batch}), ${open} open, ${rounds} rounds of ${calls} calls`
  )
  console.log(
    costTable(
      probes.map(([label]) => label),
      samples
    )
  )
})

Effect.runPromise(Effect.scoped(program)).catch((error) => {
  console.error(error)
  process.exitCode = 1
})
