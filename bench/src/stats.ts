/**
 * Queue statistics benchmark (issue 18): how long `queueStats` (live work + ring ledgers,
 * migration 0030), `queueStats({ exact: true })` and the old `countByQueueState` (the `jobs`
 * view) take with N jobs stored.
 *
 *   node bench/src/stats.ts --jobs 10000
 *   node bench/src/stats.ts --jobs 1000000 [--backlog 100000] [--keep]
 *
 * Data, through the storage layer's own paths (no hand-written rows): N - backlog jobs enqueued,
 * claimed and completed in rounds of 10,000 over 4 queues, each round followed by rotate, prune
 * (retention 1 day: completed jobs move to the history ring and stay stored) and trimLedgers, as
 * the leader does; then `backlog` jobs left available over the 4 queues, 1,000 scheduled, 500
 * dead-lettered, 200 running; then 480 of the leader's samples (migration 0031: two hours at the
 * default period, here all within the rates window). Then each read is called 20 times (after 3 warm-up calls) and
 * timed end to end (client round trip included). Postgres: `DATABASE_URL` or an embedded server
 * (durable), a fresh database dropped at the end. Output: a table on stdout and
 * `bench/results/stats-latest.json`. No thresholds (docs/benchmarks.md records the figures).
 */
import { mkdirSync, writeFileSync } from "node:fs"
import os from "node:os"
import { Migrations } from "@awa/sql"
import { PgQueueStorage, QueueStorage } from "@awa/storage"
import { NodeRuntime } from "@effect/platform-node"
import { PgClient } from "@effect/sql-pg"
import { Console, Effect, Layer, Redacted } from "effect"
import { Reactivity } from "effect/reactivity"
import {
  acquireServer,
  addOpenWork,
  createDatabase,
  databaseName,
  dropDatabase,
  fillHistory,
  intArg,
  loadLine,
  now,
  table,
  timeCalls
} from "./lib.ts"

const queues = ["stats-a", "stats-b", "stats-c", "stats-d"]
const resultsFile = new URL("../results/stats-latest.json", import.meta.url)
/** Samples taken before timing: two hours of the leader's default 15 s period. */
const samplesTaken = 480

const program = Effect.gen(function* () {
  const jobs = intArg("--jobs", 10_000)
  const backlog = Math.min(jobs, intArg("--backlog", Math.min(10_000, Math.floor(jobs / 10))))
  const server = yield* acquireServer
  const name = databaseName("awa_stats")
  const url = yield* createDatabase(server.url, name)
  // --keep leaves the database for EXPLAIN (with DATABASE_URL: an embedded server goes anyway)
  if (!process.argv.includes("--keep")) yield* Effect.addFinalizer(() => dropDatabase(server.url, name))
  const client = PgClient.layer({ url: Redacted.make(url), maxConnections: 2 })
  yield* Migrations.migrate().pipe(Effect.provide(client))
  const storage = PgQueueStorage.layer().pipe(Layer.provideMerge(client))
  yield* Console.log(`stats benchmark: ${jobs} jobs stored (${backlog} of them available), database ${name}`)
  const t0 = now()
  yield* fillHistory(queues, "stats", jobs - backlog - 1700).pipe(Effect.provide(storage))
  yield* addOpenWork(queues, "stats", "stats-dlq", backlog).pipe(Effect.provide(storage))
  const fillSeconds = (now() - t0) / 1000
  const measured = yield* Effect.gen(function* () {
    const s = yield* QueueStorage
    const sql = yield* PgClient.PgClient
    yield* sql`VACUUM ANALYZE`.pipe(Effect.ignore)
    const stored = (yield* sql<{ n: bigint }>`SELECT count(*) AS n FROM awa.jobs`)[0]!.n
    // the leader's samples (migration 0031): two hours' worth, all inside the rates window (the
    // worst case for the rates read), each one timed as the leader's duty
    const sampling = yield* timeCalls(
      s.sampleQueueStats({ minIntervalMs: 0, keepMs: 7_200_000 }),
      samplesTaken - 3
    )
    const fast = yield* timeCalls(s.queueStats())
    const exact = yield* timeCalls(s.queueStats({ exact: true }))
    const view = yield* timeCalls(s.countByQueueState)
    const history = yield* timeCalls(s.queueHistory())
    const sample = yield* s.queueStats()
    return { stored: Number(stored), fast, exact, view, history, sampling, sample }
  }).pipe(Effect.provide(storage))
  const rows = [
    ["queueStats() (with rates)", measured.fast],
    ["queueStats({ exact: true })", measured.exact],
    ["countByQueueState (jobs view)", measured.view],
    [`queueHistory() (${samplesTaken} samples)`, measured.history],
    ["sampleQueueStats (the leader, per sample)", measured.sampling]
  ] as const
  yield* Console.log(
    `\n${measured.stored} jobs stored (filled in ${fillSeconds.toFixed(0)} s); load ${loadLine()}\n` +
      table(
        ["read", "p50 ms", "p95 ms", "max ms"],
        rows.map(([label, c]) => [label, c.p50Ms, c.p95Ms, c.maxMs])
      )
  )
  yield* Console.log(
    table(
      ["queue", "available", "running", "scheduled", "dlq", "completed total", "enq/s"],
      measured.sample.queues.map((q) => [
        q.queue,
        q.available,
        q.running,
        q.scheduled,
        q.deadLettered,
        q.finalizedTotal.completed,
        q.rates?.enqueuedPerSecond.toFixed(1) ?? "-"
      ])
    )
  )
  const cpus = os.cpus()
  mkdirSync(new URL(".", resultsFile), { recursive: true })
  writeFileSync(
    resultsFile,
    `${JSON.stringify(
      {
        startedAt: new Date().toISOString(),
        jobs,
        backlog,
        stored: measured.stored,
        machine: {
          cpus: cpus.length,
          cpuModel: cpus[0]?.model ?? "unknown",
          load: loadLine(),
          node: process.version
        },
        database: server.started ? "embedded" : "DATABASE_URL",
        reads: Object.fromEntries(rows.map(([label, c]) => [label, c]))
      },
      null,
      2
    )}\n`
  )
}).pipe(Effect.scoped, Effect.provide(Reactivity.layer))

NodeRuntime.runMain(program)
