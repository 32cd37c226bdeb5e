/**
 * Storage-level benchmark of the queue storage engine (storage-engine.md, "Measure"): drives
 * `PgQueueStorage` directly, with no runtime, no handlers and no LISTEN/NOTIFY, and reports what
 * the engine itself costs per job.
 *
 *   npm run bench:storage                      # 100,000 jobs
 *   node bench/src/storage.ts --jobs 20000     # any size
 *
 * Postgres: `DATABASE_URL` when set (the role needs CREATEDB, and CHECKPOINT rights for clean WAL
 * figures), otherwise a temporary embedded PostgreSQL started with durability ON (fsync,
 * synchronous_commit and full_page_writes at their defaults), stopped and deleted on exit. Every
 * run uses a fresh database, migrated with `Migrations.migrate()` and dropped at the end.
 *
 * Phases, in order, each on its own connection pool (closed at the end of the phase so the
 * backends flush their table statistics):
 *   1. enqueue: `enqueueMany` in chunks of 1,000, one producer, N jobs;
 *   2. claim probe: `claim(max 1)` + complete, 50 times, against the N-job backlog;
 *   3. claim probe: `claim(max 50)` + complete, 50 times (the runtime's claim size at low load);
 *   4. claim + complete: one claimer, claim 512 then `finalizeMany` Complete for all 512, until
 *      the queue is empty;
 *   5. enqueue bulk: one `enqueueMany` of N jobs (split by the layer into chunks of 5,000 inside
 *      one transaction);
 *   6. claim + complete again, draining the bulk backlog (which sits in one ring slot).
 * A maintenance fiber does what the leader would: `rotate` then `prune` (retention 0) every
 * second, throughout every phase. Before each phase: `CHECKPOINT`, then `pg_current_wal_lsn()`;
 * after it: WAL bytes (split by record type when `pg_walinspect` can be installed), full-page
 * images and commits per job, and per table family (ring children summed; system catalogs listed
 * too, since every TRUNCATE rewrites `pg_class` rows) the rows inserted, updated and deleted per
 * job and the dead tuples left, from `pg_stat_all_tables` read 1.5 s after the pool closed.
 *
 * When the server preloads `pg_stat_statements` (docs/benchmarks.md, "How the breakdown was
 * obtained"), each call also gets its mean server execution time.
 *
 * Output: a table on stdout and `bench/results/storage-latest.json`. No thresholds: figures
 * depend on the machine and on whatever else runs on it (the load average is recorded).
 */
import { mkdirSync, writeFileSync } from "node:fs"
import os from "node:os"
import type { NewJob } from "@awa/core"
import { Migrations } from "@awa/sql"
import { type ClaimedJob, PgQueueStorage, QueueStorage } from "@awa/storage"
import { NodeRuntime } from "@effect/platform-node"
import { PgClient } from "@effect/sql-pg"
import { Console, Effect, Layer, Redacted } from "effect"
import { Reactivity } from "effect/reactivity"
import {
  acquireServer,
  createDatabase,
  databaseName,
  dropDatabase,
  now,
  perJob,
  round,
  sum,
  table
} from "./lib.ts"

// ---------------------------------------------------------------------------------------------
// Settings

const queue = "bench"
const enqueueChunk = 1_000
const claimBatch = 512
const probeCalls = 50
const probeBatch = 50
const statsSettleMs = 1_500
const retentionZero = { completedMs: 0, failedMs: 0, cancelledMs: 0 }
const resultsFile = new URL("../results/storage-latest.json", import.meta.url)

const parseJobs = (argv: ReadonlyArray<string>): number => {
  const i = argv.indexOf("--jobs")
  if (i === -1) return 100_000
  const n = Number(argv[i + 1])
  if (!Number.isInteger(n) || n < 1) throw new Error(`--jobs needs a positive integer (got ${argv[i + 1]})`)
  return n
}

const newJobs = (count: number, offset: number): Array<NewJob> =>
  Array.from({ length: count }, (_, i) => ({ kind: "bench", queue, args: { seq: offset + i } }))

// ---------------------------------------------------------------------------------------------
// Server, database, observer

/** A fresh, migrated database on the server; dropped when the scope closes. */
const acquireDatabase = (serverUrl: string) =>
  Effect.acquireRelease(
    Effect.gen(function* () {
      const name = databaseName("awa_bench")
      const url = yield* createDatabase(serverUrl, name)
      yield* Migrations.migrate().pipe(Effect.provide(PgClient.layer({ url: Redacted.make(url) })))
      return { name, url }
    }),
    ({ name }) => dropDatabase(serverUrl, name)
  )

interface FamilyStats {
  readonly ins: number
  readonly upd: number
  readonly del: number
  readonly dead: number
}

interface Snapshot {
  readonly families: Record<string, FamilyStats>
  readonly walFpi: number
  readonly walRecords: number
  readonly commits: number
}

/** Reads server-wide figures on its own connection (which never touches Awa's tables). */
const makeObserver = (sql: PgClient.PgClient) => ({
  lsn: Effect.map(sql<{ lsn: string }>`SELECT pg_current_wal_lsn()::text AS lsn`, (rows) => rows[0]!.lsn),
  walBytes: (from: string, to: string) =>
    Effect.map(
      sql<{ bytes: bigint }>`SELECT pg_wal_lsn_diff(${to}::pg_lsn, ${from}::pg_lsn)::bigint AS bytes`,
      (rows) => Number(rows[0]!.bytes)
    ),
  /** WAL bytes per record type (Heap/INSERT, Btree/INSERT_LEAF, …); empty without `pg_walinspect`. */
  walByRecord: (from: string, to: string) =>
    sql<{ record: string; bytes: bigint }>`
      SELECT "resource_manager/record_type" AS record, combined_size::bigint AS bytes
      FROM pg_get_wal_stats(${from}::pg_lsn, ${to}::pg_lsn, true) WHERE count > 0 ORDER BY combined_size DESC`.pipe(
      Effect.map((rows) => rows.map((r) => ({ record: r.record, bytes: Number(r.bytes) }))),
      Effect.catch(() => Effect.succeed([]))
    ),
  /** `pg_walinspect` gives the WAL breakdown; it needs a superuser, so it is optional. */
  enableWalInspect: sql.unsafe("CREATE EXTENSION IF NOT EXISTS pg_walinspect").unprepared.pipe(
    Effect.as(true),
    Effect.catch(() => Effect.succeed(false))
  ),
  /** Checkpoints so every phase starts from the same full-page-image state; skipped without rights. */
  checkpoint: sql.unsafe("CHECKPOINT").unprepared.pipe(
    Effect.as(true),
    Effect.catch(() => Effect.succeed(false))
  ),
  snapshot: Effect.gen(function* () {
    const tables = yield* sql<{ family: string; ins: bigint; upd: bigint; del: bigint; dead: bigint }>`
      SELECT CASE WHEN schemaname = 'awa' THEN regexp_replace(relname, '_[0-9]+$', '')
                  ELSE schemaname || '.' || relname END AS family,
             sum(n_tup_ins)::bigint AS ins, sum(n_tup_upd)::bigint AS upd,
             sum(n_tup_del)::bigint AS del, sum(n_dead_tup)::bigint AS dead
      FROM pg_stat_all_tables WHERE schemaname IN ('awa', 'pg_catalog') GROUP BY 1 ORDER BY 1`
    const [wal] = yield* sql<{ records: bigint; fpi: bigint }>`
      SELECT wal_records::bigint AS records, wal_fpi::bigint AS fpi FROM pg_stat_wal`
    const [db] = yield* sql<{ commits: bigint }>`
      SELECT xact_commit::bigint AS commits FROM pg_stat_database WHERE datname = current_database()`
    const families: Record<string, FamilyStats> = {}
    for (const t of tables) {
      families[t.family] = {
        ins: Number(t.ins),
        upd: Number(t.upd),
        del: Number(t.del),
        dead: Number(t.dead)
      }
    }
    return {
      families,
      walFpi: Number(wal!.fpi),
      walRecords: Number(wal!.records),
      commits: Number(db!.commits)
    } satisfies Snapshot
  }),
  /**
   * Server time per call from `pg_stat_statements`, when the server preloads it (see
   * docs/benchmarks.md, "How the breakdown was obtained"); false otherwise.
   */
  enableStatements: sql.unsafe("CREATE EXTENSION IF NOT EXISTS pg_stat_statements").unprepared.pipe(
    Effect.andThen(sql`SELECT pg_stat_statements_reset()`),
    Effect.as(true),
    Effect.catch(() => Effect.succeed(false))
  ),
  resetStatements: sql`SELECT pg_stat_statements_reset()`.pipe(Effect.asVoid),
  /** Top-level calls of the storage functions: count and mean execution time (nested included). */
  serverCalls: sql<{ fn: string; calls: number; mean_ms: number }>`
    SELECT substring(query FROM '[.](claim|finalize|enqueue)[(]') AS fn, sum(calls)::int AS calls,
           (sum(total_exec_time) / greatest(sum(calls), 1))::float8 AS mean_ms
    FROM pg_stat_statements
    WHERE toplevel AND dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND query ~ '[.](claim|finalize|enqueue)[(]'
    GROUP BY 1`.pipe(
    Effect.map((rows) =>
      Object.fromEntries(rows.map((r) => [r.fn, { calls: r.calls, meanMs: round(Number(r.mean_ms), 3) }]))
    )
  ),
  settings: sql<{ name: string; setting: string }>`
    SELECT name, current_setting(name) AS setting FROM pg_settings
    WHERE name IN ('server_version', 'fsync', 'synchronous_commit', 'full_page_writes', 'wal_level',
                   'shared_buffers', 'max_wal_size', 'checkpoint_timeout', 'wal_compression', 'autovacuum_naptime')
    ORDER BY name`
})

type Observer = ReturnType<typeof makeObserver>

// ---------------------------------------------------------------------------------------------
// Workload

/** Outcomes of the leader-like maintenance loop during one phase. */
type Tally = Record<string, number>

const count = (tally: Tally, key: string) => {
  tally[key] = (tally[key] ?? 0) + 1
}

/** rotate + prune (retention 0) every second, as the leader does; errors are counted, not fatal. */
const maintenance = (tally: Tally) =>
  Effect.gen(function* () {
    const storage = yield* QueueStorage
    count(tally, `rotate:${yield* storage.rotate}`)
    const pruned = yield* storage.prune(retentionZero)
    count(tally, pruned._tag === "Blocked" ? `prune:Blocked:${pruned.reason}` : `prune:${pruned._tag}`)
  }).pipe(
    Effect.catch((error) => Effect.sync(() => count(tally, `error:${error._tag}`))),
    Effect.andThen(Effect.sleep("1 second")),
    Effect.forever
  )

/** Call timings of one kind of storage call. */
interface Calls {
  readonly count: number
  readonly meanMs: number
  readonly p50Ms: number
  readonly p95Ms: number
  readonly maxMs: number
  /** Mean server execution time of the call (`pg_stat_statements`), when available. */
  readonly serverMeanMs?: number | undefined
}

const summarize = (samples: Array<number>): Calls => {
  const sorted = [...samples].sort((a, b) => a - b)
  const at = (q: number) => sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))] ?? 0
  return {
    count: sorted.length,
    meanMs: round(sum(sorted) / Math.max(1, sorted.length), 3),
    p50Ms: round(at(0.5), 3),
    p95Ms: round(at(0.95), 3),
    maxMs: round(sorted.at(-1) ?? 0, 3)
  }
}

const timed = <A, E, R>(effect: Effect.Effect<A, E, R>, samples: Array<number>) =>
  Effect.suspend(() => {
    const start = now()
    return Effect.tap(effect, () => Effect.sync(() => samples.push(now() - start)))
  })

/** What a workload body reports: jobs done plus any call timings worth printing. */
interface Work {
  readonly jobs: number
  readonly calls: Record<string, Calls>
}

const enqueueChunked = (jobs: ReadonlyArray<NewJob>) =>
  Effect.gen(function* () {
    const storage = yield* QueueStorage
    const samples: Array<number> = []
    for (let i = 0; i < jobs.length; i += enqueueChunk) {
      yield* timed(storage.enqueueMany(jobs.slice(i, i + enqueueChunk)), samples)
    }
    return { jobs: jobs.length, calls: { enqueueMany: summarize(samples) } } satisfies Work
  })

const enqueueBulk = (jobs: ReadonlyArray<NewJob>) =>
  Effect.gen(function* () {
    const storage = yield* QueueStorage
    yield* storage.enqueueMany(jobs)
    return { jobs: jobs.length, calls: {} } satisfies Work
  })

const completeAll = (batch: ReadonlyArray<ClaimedJob>) =>
  Effect.gen(function* () {
    const storage = yield* QueueStorage
    const results = yield* storage.finalizeMany(
      batch.map((job) => ({
        jobId: job.jobId,
        runLease: job.runLease,
        outcome: { _tag: "Complete" } as const
      }))
    )
    const stale = results.filter((r) => r._tag !== "Applied").length
    if (stale > 0) return yield* Effect.die(new Error(`${stale} completions were stale`))
  })

/** Claims `max` at a time and completes each batch, `limit` times or until the queue is empty. */
const claimAndComplete = (max: number, limit = Number.POSITIVE_INFINITY) =>
  Effect.gen(function* () {
    const storage = yield* QueueStorage
    const claimMs: Array<number> = []
    const finalizeMs: Array<number> = []
    let jobs = 0
    for (let i = 0; i < limit; i++) {
      const start = now()
      const batch = yield* storage.claim({ queue, max, deadlineMs: 0, agingIntervalMs: 0 })
      if (batch.length === 0) break // the final, empty claim is not a sample
      claimMs.push(now() - start)
      yield* timed(completeAll(batch), finalizeMs)
      jobs += batch.length
    }
    return {
      jobs,
      calls: { [`claim(${max})`]: summarize(claimMs), [`finalizeMany(${max})`]: summarize(finalizeMs) }
    } satisfies Work
  })

// ---------------------------------------------------------------------------------------------
// Phases

interface PhaseResult {
  readonly name: string
  readonly jobs: number
  readonly seconds: number
  readonly jobsPerSecond: number
  readonly checkpointed: boolean
  readonly walBytes: number
  readonly walBytesPerJob: number
  readonly walRecordsPerJob: number
  readonly walFpiPerJob: number
  readonly walBytesPerJobByRecord: Record<string, number>
  readonly commitsPerJob: number
  readonly calls: Record<string, Calls>
  readonly maintenance: Tally
  /** 1-minute load average when the phase ended (other work shares the machine). */
  readonly loadAfter: number
  /** Per table family: rows inserted/updated/deleted per job during the phase, dead tuples after it. */
  readonly tables: Record<
    string,
    { insPerJob: number; updPerJob: number; delPerJob: number; deadAfter: number }
  >
}

const tableDeltas = (before: Snapshot, after: Snapshot, jobs: number): PhaseResult["tables"] => {
  const zero: FamilyStats = { ins: 0, upd: 0, del: 0, dead: 0 }
  return Object.fromEntries(
    Object.entries(after.families).map(([family, a]) => {
      const b = before.families[family] ?? zero
      return [
        family,
        {
          insPerJob: round(perJob(a.ins - b.ins, jobs), 3),
          updPerJob: round(perJob(a.upd - b.upd, jobs), 3),
          delPerJob: round(perJob(a.del - b.del, jobs), 3),
          deadAfter: a.dead
        }
      ]
    })
  )
}

/**
 * Runs `work` on a fresh pool with the maintenance fiber beside it, and measures it. Throughput
 * counts the body only; WAL, commits and table statistics include maintenance (it is part of the
 * engine's cost).
 */
const runPhase = (
  observer: Observer,
  url: string,
  name: string,
  work: Effect.Effect<Work, unknown, QueueStorage>,
  statements: boolean
) =>
  Effect.gen(function* () {
    const checkpointed = yield* observer.checkpoint
    if (statements) yield* observer.resetStatements
    const before = yield* observer.snapshot
    const lsn = yield* observer.lsn
    const tally: Tally = {}
    const workload = PgQueueStorage.layer().pipe(
      Layer.provide(
        PgClient.layer({ url: Redacted.make(url), maxConnections: 4, applicationName: "awa-bench" })
      )
    )
    const { done, seconds } = yield* Effect.gen(function* () {
      yield* Effect.forkScoped(maintenance(tally))
      const start = now()
      const done = yield* work
      return { done, seconds: (now() - start) / 1000 }
    }).pipe(Effect.scoped, Effect.provide(workload))
    const endLsn = yield* observer.lsn
    const server = statements ? yield* observer.serverCalls : {}
    // claim(N) / finalizeMany(N) / enqueueMany: one size per phase, so the function names the call
    const fnOf = (call: string) =>
      call.startsWith("claim(") ? "claim" : call.startsWith("finalizeMany") ? "finalize" : "enqueue"
    const calls = Object.fromEntries(
      Object.entries(done.calls).map(([call, c]) => [
        call,
        { ...c, serverMeanMs: server[fnOf(call)]?.meanMs }
      ])
    )
    const walBytes = yield* observer.walBytes(lsn, endLsn)
    yield* Effect.sleep(statsSettleMs)
    const after = yield* observer.snapshot
    const walByRecord = yield* observer.walByRecord(lsn, endLsn)
    const result: PhaseResult = {
      name,
      jobs: done.jobs,
      seconds: round(seconds, 3),
      jobsPerSecond: Math.round(perJob(done.jobs, seconds)),
      checkpointed,
      walBytes,
      walBytesPerJob: Math.round(perJob(walBytes, done.jobs)),
      walRecordsPerJob: round(perJob(after.walRecords - before.walRecords, done.jobs)),
      walFpiPerJob: round(perJob(after.walFpi - before.walFpi, done.jobs), 3),
      walBytesPerJobByRecord: Object.fromEntries(
        walByRecord.map((r) => [r.record, Math.round(perJob(r.bytes, done.jobs))])
      ),
      commitsPerJob: round(perJob(after.commits - before.commits, done.jobs), 4),
      calls,
      maintenance: tally,
      loadAfter: round(os.loadavg()[0]!),
      tables: tableDeltas(before, after, done.jobs)
    }
    yield* Console.log(
      `  ${name}: ${result.jobs} jobs in ${result.seconds} s (${result.jobsPerSecond} jobs/s), ${result.walBytesPerJob} B WAL/job`
    )
    return result
  })

// ---------------------------------------------------------------------------------------------
// Report

const isCatalog = (family: string) => family.startsWith("pg_catalog.")

const render = (report: Report): string => {
  const lines: Array<string> = []
  const m = report.machine
  lines.push(
    `Machine: ${m.cpus} × ${m.cpuModel}, ${m.memGiB} GiB; Node ${m.node}; PostgreSQL ${report.postgres.server_version}`,
    `Load average before ${m.loadBefore.join(" ")}, after ${m.loadAfter.join(" ")}; jobs per phase ${report.jobs}`,
    `Postgres: ${Object.entries(report.postgres)
      .filter(([k]) => k !== "server_version")
      .map(([k, v]) => `${k}=${v}`)
      .join(", ")}`,
    "",
    table(
      ["phase", "jobs", "s", "jobs/s", "WAL B/job", "WAL rec/job", "FPI/job", "commits/job", "load"],
      report.phases.map((p) => [
        p.name,
        p.jobs,
        p.seconds,
        p.jobsPerSecond,
        p.walBytesPerJob,
        p.walRecordsPerJob,
        p.walFpiPerJob,
        p.commitsPerJob,
        p.loadAfter
      ])
    ),
    ""
  )
  const calls = report.phases.flatMap((p) =>
    Object.entries(p.calls).map(([call, c]) => [
      p.name,
      call,
      c.count,
      c.meanMs,
      c.p50Ms,
      c.p95Ms,
      c.maxMs,
      c.serverMeanMs ?? "n/a"
    ])
  )
  lines.push(
    table(["phase", "call", "calls", "mean ms", "p50 ms", "p95 ms", "max ms", "server mean ms"], calls),
    report.statements
      ? "server mean ms: pg_stat_statements, top-level execution time of the call (nested statements included)"
      : "server mean ms: n/a (the server does not preload pg_stat_statements)",
    ""
  )
  for (const p of report.phases) {
    const rows = Object.entries(p.tables)
      // Awa's tables when touched or dead; catalogs only when this phase wrote to them.
      .filter(
        ([family, t]) => t.insPerJob + t.updPerJob + t.delPerJob + (isCatalog(family) ? 0 : t.deadAfter) > 0
      )
      .map(([family, t]) => [family, t.insPerJob, t.updPerJob, t.delPerJob, t.deadAfter])
    lines.push(
      `${p.name}: maintenance ${Object.entries(p.maintenance)
        .map(([k, v]) => `${k}×${v}`)
        .join(", ")}`,
      `WAL B/job by record type: ${
        Object.entries(p.walBytesPerJobByRecord)
          .map(([k, v]) => `${k} ${v}`)
          .join(", ") || "n/a (pg_walinspect unavailable)"
      }`,
      table(["table family", "ins/job", "upd/job", "del/job", "dead after"], rows),
      ""
    )
  }
  return lines.join("\n")
}

interface Report {
  readonly startedAt: string
  readonly jobs: number
  readonly database: "embedded" | "DATABASE_URL"
  readonly machine: {
    readonly cpus: number
    readonly cpuModel: string
    readonly memGiB: number
    readonly node: string
    readonly loadBefore: ReadonlyArray<number>
    readonly loadAfter: ReadonlyArray<number>
  }
  readonly postgres: Record<string, string>
  /** Whether `pg_stat_statements` gave the server time per call. */
  readonly statements: boolean
  readonly phases: ReadonlyArray<PhaseResult>
}

const loadAverage = () => os.loadavg().map((l) => round(l))

// ---------------------------------------------------------------------------------------------
// Main

const program = Effect.gen(function* () {
  const jobs = parseJobs(process.argv.slice(2))
  const startedAt = new Date().toISOString()
  const loadBefore = loadAverage()
  const server = yield* acquireServer
  const db = yield* acquireDatabase(server.url)
  const observer = makeObserver(yield* PgClient.makeClient({ url: Redacted.make(db.url) }))
  const settings = yield* observer.settings
  yield* observer.enableWalInspect
  const statements = yield* observer.enableStatements
  yield* Console.log(`storage benchmark: ${jobs} jobs per phase, database ${db.name}`)

  const phase = (name: string, work: Effect.Effect<Work, unknown, QueueStorage>) =>
    runPhase(observer, db.url, name, work, statements)
  const phases = [
    yield* phase(`enqueue (chunks of ${enqueueChunk})`, enqueueChunked(newJobs(jobs, 0))),
    yield* phase("claim probe (max 1)", claimAndComplete(1, probeCalls)),
    // the runtime's claim size at low load (one claim per wake-up, up to its free capacity)
    yield* phase(`claim probe (max ${probeBatch})`, claimAndComplete(probeBatch, probeCalls)),
    yield* phase(`claim + complete (batch ${claimBatch})`, claimAndComplete(claimBatch)),
    yield* phase("enqueue (one bulk call)", enqueueBulk(newJobs(jobs, jobs))),
    yield* phase(`claim + complete (batch ${claimBatch}, bulk backlog)`, claimAndComplete(claimBatch))
  ]

  const cpus = os.cpus()
  const report: Report = {
    startedAt,
    jobs,
    database: server.started ? "embedded" : "DATABASE_URL",
    machine: {
      cpus: cpus.length,
      cpuModel: cpus[0]?.model ?? "unknown",
      memGiB: round(os.totalmem() / 2 ** 30, 1),
      node: process.version,
      loadBefore,
      loadAfter: loadAverage()
    },
    postgres: Object.fromEntries(settings.map((s) => [s.name, s.setting])),
    statements,
    phases
  }
  yield* Console.log(`\n${render(report)}`)
  mkdirSync(new URL(".", resultsFile), { recursive: true })
  writeFileSync(resultsFile, `${JSON.stringify(report, null, 2)}\n`)
  yield* Console.log(`written ${resultsFile.pathname}`)
}).pipe(Effect.scoped, Effect.provide(Reactivity.layer))

NodeRuntime.runMain(program)
