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
 * dead-lettered, 200 running. Then each read is called 20 times (after 3 warm-up calls) and
 * timed end to end (client round trip included). Postgres: `DATABASE_URL` or an embedded server
 * (durable), a fresh database dropped at the end. Output: a table on stdout and
 * `bench/results/stats-latest.json`. No thresholds (docs/benchmarks.md records the figures).
 */
import { mkdirSync, writeFileSync } from "node:fs"
import os from "node:os"
import type { NewJob } from "@awa/core"
import { Migrations } from "@awa/sql"
import { PgQueueStorage, QueueStorage } from "@awa/storage"
import { NodeRuntime } from "@effect/platform-node"
import { PgClient } from "@effect/sql-pg"
import { Console, Effect, Layer, Redacted } from "effect"
import { Reactivity } from "effect/reactivity"
import {
  acquireServer,
  createDatabase,
  databaseName,
  dropDatabase,
  loadLine,
  now,
  summarize,
  table
} from "./lib.ts"

const queues = ["stats-a", "stats-b", "stats-c", "stats-d"]
const round = 10_000
const calls = 20
const day = 86_400_000
const keep = { completedMs: day, failedMs: 3 * day, cancelledMs: 3 * day }
const resultsFile = new URL("../results/stats-latest.json", import.meta.url)

const arg = (name: string, fallback: number): number => {
  const argv = process.argv.slice(2)
  const i = argv.indexOf(name)
  if (i === -1) return fallback
  const n = Number(argv[i + 1])
  if (!Number.isInteger(n) || n < 0)
    throw new Error(`${name} needs a non-negative integer (got ${argv[i + 1]})`)
  return n
}

const jobsOf = (count: number, extra: Partial<NewJob> = {}): Array<NewJob> =>
  Array.from({ length: count }, (_, i) => ({
    kind: "stats",
    queue: queues[i % queues.length]!,
    args: { i },
    ...extra
  }))

/** Enqueues, claims and completes `count` jobs in rounds, reclaiming the queue ring after each. */
const fillHistory = (count: number) =>
  Effect.gen(function* () {
    const storage = yield* QueueStorage
    for (let done = 0; done < count; done += round) {
      const n = Math.min(round, count - done)
      yield* storage.enqueueMany(jobsOf(n))
      for (const queue of queues) {
        const claimed = yield* storage.claim({ queue, max: n, deadlineMs: 0, agingIntervalMs: 0 })
        yield* storage.finalizeMany(
          claimed.map((c) => ({ jobId: c.jobId, runLease: c.runLease, outcome: { _tag: "Complete" } }))
        )
      }
      yield* storage.rotateWhenDue({ minRows: 1, maxAgeMs: 0 })
      yield* storage.prune({ ...keep, carryAfterMs: 0 })
      yield* storage.pruneHistory(keep)
      yield* storage.rotateHistory(0)
      yield* storage.trimLedgers(1000)
      if ((done / round) % 10 === 0) yield* Console.log(`  ${done + n} jobs stored (load ${loadLine()})`)
    }
  })

/** Open work: a backlog, scheduled jobs, dead letters and open attempts. */
const addOpenWork = (backlog: number) =>
  Effect.gen(function* () {
    const storage = yield* QueueStorage
    for (let done = 0; done < backlog; done += round)
      yield* storage.enqueueMany(jobsOf(Math.min(round, backlog - done)))
    yield* storage.enqueueMany(jobsOf(1000, { runAt: new Date(Date.now() + day) }))
    yield* storage.configureQueue("stats-dlq", { dlq: true })
    yield* storage.enqueueMany(
      Array.from({ length: 700 }, (_, i) => ({
        kind: "stats",
        queue: "stats-dlq",
        args: { i },
        maxAttempts: 1
      }))
    )
    const failing = yield* storage.claim({ queue: "stats-dlq", max: 500, deadlineMs: 0, agingIntervalMs: 0 })
    yield* storage.finalizeMany(
      failing.map((c) => ({
        jobId: c.jobId,
        runLease: c.runLease,
        outcome: { _tag: "Fail", error: "bench" }
      }))
    )
    yield* storage.claim({ queue: "stats-dlq", max: 200, deadlineMs: 0, agingIntervalMs: 0 })
  })

const time = <A, E, R>(effect: Effect.Effect<A, E, R>) =>
  Effect.gen(function* () {
    for (let i = 0; i < 3; i++) yield* effect
    const samples: Array<number> = []
    for (let i = 0; i < calls; i++) {
      const t = now()
      yield* effect
      samples.push(now() - t)
    }
    return summarize(samples)
  })

const program = Effect.gen(function* () {
  const jobs = arg("--jobs", 10_000)
  const backlog = Math.min(jobs, arg("--backlog", Math.min(10_000, Math.floor(jobs / 10))))
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
  yield* fillHistory(jobs - backlog - 1700).pipe(Effect.provide(storage))
  yield* addOpenWork(backlog).pipe(Effect.provide(storage))
  const fillSeconds = (now() - t0) / 1000
  const measured = yield* Effect.gen(function* () {
    const s = yield* QueueStorage
    const sql = yield* PgClient.PgClient
    yield* sql`VACUUM ANALYZE`.pipe(Effect.ignore)
    const stored = (yield* sql<{ n: bigint }>`SELECT count(*) AS n FROM awa.jobs`)[0]!.n
    const fast = yield* time(s.queueStats())
    const exact = yield* time(s.queueStats({ exact: true }))
    const view = yield* time(s.countByQueueState)
    const sample = yield* s.queueStats()
    return { stored: Number(stored), fast, exact, view, sample }
  }).pipe(Effect.provide(storage))
  const rows = [
    ["queueStats()", measured.fast],
    ["queueStats({ exact: true })", measured.exact],
    ["countByQueueState (jobs view)", measured.view]
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
      ["queue", "available", "running", "scheduled", "dlq", "completed total"],
      measured.sample.queues.map((q) => [
        q.queue,
        q.available,
        q.running,
        q.scheduled,
        q.deadLettered,
        q.finalizedTotal.completed
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
