/**
 * The workloads of the comparison, run the same way for every system. Each phase runs in a
 * fresh database (cloned from the system's migrated template) and a fresh child process:
 *
 * - `enqueue-one`: sequential one-at-a-time enqueue (each job its own transaction);
 * - `enqueue-one-8` / `enqueue-one-8q`: the same with 8 concurrent producers in the child, on one
 *   queue / spread over 8 queues (issue 17);
 * - `enqueue-batch`: enqueue in chunks of 1,000 (one call each);
 * - `enqueue-bulk`: one call with the whole batch (Awa's bulk path; the peers' batch call too);
 * - `drain`: a queued backlog, then start workers and time until storage shows all completed,
 *   with WAL, dead tuples and CPU measured over the same interval;
 * - `scale`: the drain with 1, 2 and 4 worker processes, 50 in flight split between them
 *   (issue 17); timed by the orchestrator, which sums the processes' handler starts;
 * - `latency`: a fixed rate offered to idle workers; handler start minus enqueue commit.
 *
 * Every result records the server it ran on and Awa's profile (`server`, `profile`).
 *
 * Hygiene per measured interval: a fixed warm-up in the same process first, a wait for a quiet
 * machine (other processes below a CPU threshold), `CHECKPOINT` before (so WAL figures start from
 * the same full-page-image state), and an exactly-once check after (every job's handler started
 * once, and storage shows none open).
 */
import { Effect, type Scope } from "effect"
import { now, perJob, round, sum } from "../lib.ts"
import { inFlight, type Profile, queueCount } from "../systems/types.ts"
import { type Child, ChildError } from "./childProcess.ts"
import {
  analyze,
  checkpoint,
  currentLsn,
  resetStatements,
  type ServerDescription,
  type Statement,
  type TableStats,
  tableStats,
  topStatements,
  walBytes
} from "./observer.ts"
import { type ChildPids, cpuDelta, loadAverage, type QuietWait, readCpu, waitQuiet } from "./proc.ts"
import type { DrainTimes, Executions, Latencies, Timed, Verification } from "./protocol.ts"

export type PhaseName =
  | "enqueue-one"
  | "enqueue-one-8"
  | "enqueue-one-8q"
  | "enqueue-batch"
  | "enqueue-bulk"
  | "drain"
  | "scale"
  | "latency"

export const phaseNames: ReadonlyArray<PhaseName> = [
  "enqueue-one",
  "enqueue-one-8",
  "enqueue-one-8q",
  "enqueue-batch",
  "enqueue-bulk",
  "drain",
  "scale",
  "latency"
]

/** Producers of `enqueue-one-8` and `enqueue-one-8q`. */
export const concurrentProducers = 8

/** Worker processes of the `scale` phase, one run each. */
export const scaleProcesses: ReadonlyArray<number> = [1, 2, 4]

/** `total` split into `parts` shares differing by at most one (50 over 4: 13, 13, 12, 12). */
export const shares = (total: number, parts: number): ReadonlyArray<number> =>
  Array.from({ length: parts }, (_, i) => Math.floor(total / parts) + (i < total % parts ? 1 : 0))

export interface Sizes {
  readonly enqueueOne: number
  readonly enqueueOneWarm: number
  /** All producers together, `enqueue-one-8` and `enqueue-one-8q`. */
  readonly enqueueOne8: number
  readonly enqueueOne8Warm: number
  readonly enqueueBatch: number
  readonly enqueueBatchWarm: number
  readonly chunk: number
  readonly bulk: number
  readonly bulkWarm: number
  readonly drain: number
  readonly drainWarm: number
  readonly rate: number
  readonly latencySeconds: number
  readonly latencyWarmSeconds: number
}

export const fullSizes: Sizes = {
  enqueueOne: 2_000,
  enqueueOneWarm: 200,
  enqueueOne8: 4_000,
  enqueueOne8Warm: 400,
  enqueueBatch: 20_000,
  enqueueBatchWarm: 2_000,
  chunk: 1_000,
  bulk: 100_000,
  bulkWarm: 5_000,
  drain: 20_000,
  drainWarm: 1_000,
  rate: 200,
  latencySeconds: 20,
  latencyWarmSeconds: 2
}

export const quickSizes: Sizes = {
  enqueueOne: 500,
  enqueueOneWarm: 100,
  enqueueOne8: 1_000,
  enqueueOne8Warm: 200,
  enqueueBatch: 5_000,
  enqueueBatchWarm: 1_000,
  chunk: 1_000,
  bulk: 20_000,
  bulkWarm: 2_000,
  drain: 5_000,
  drainWarm: 500,
  rate: 200,
  latencySeconds: 5,
  latencyWarmSeconds: 1
}

export interface Hygiene {
  /** A phase starts once other processes use fewer cores than this (1 s sample)… */
  readonly maxOtherCores: number
  /** …or once it has waited this long. */
  readonly maxQuietWaitMs: number
}

export interface PhaseContext {
  /** The entrant's name in results: the system, or `awa-defaults` for Awa's defaults profile. */
  readonly label: string
  /** Awa's profile; undefined for the peers. */
  readonly profile: Profile | undefined
  readonly server: ServerDescription
  readonly child: Child
  /** Another child of the same system on the same database (the scale phase), closed with the scope. */
  readonly spawnMore: Effect.Effect<Child, ChildError, Scope.Scope>
  readonly serverUrl: string
  readonly dbUrl: string
  readonly postmasterPid: number | undefined
  readonly sizes: Sizes
  readonly hygiene: Hygiene
  /** Record the top `pg_stat_statements` entries of each measured interval. */
  readonly statements: boolean
}

export interface TableDelta {
  readonly insPerJob: number
  readonly updPerJob: number
  readonly delPerJob: number
  /** Change of `n_dead_tup` over the phase, per job. */
  readonly deadPerJob: number
  readonly deadAfter: number
  readonly vacuumed: boolean
}

export interface Correctness {
  readonly ok: boolean
  readonly detail: string
  readonly verification?: Verification | undefined
  readonly openJobs: number
}

export interface PhaseResult {
  readonly phase: PhaseName
  /** The entrant: the system's name, or `awa-defaults` (Awa's defaults profile). */
  readonly system: string
  /** Awa's profile (`tuned` or `defaults`); absent for the peers. */
  readonly profile?: Profile | undefined
  /** The server this phase ran on. */
  readonly server: ServerDescription
  /** Worker processes (the scale phase). */
  readonly processes?: number | undefined
  /** Concurrent producers and the queues they spread over (`enqueue-one-8`, `enqueue-one-8q`). */
  readonly producers?: number | undefined
  readonly queues?: number | undefined
  /** Wall time of the whole phase: clone, child start, warm-up, waits, checks (set by compare.ts). */
  readonly wallSeconds?: number | undefined
  /** `--rounds` above 1: which round (from 1) this result is of. */
  readonly round?: number | undefined
  readonly jobs: number
  readonly seconds: number
  readonly jobsPerSec: number
  readonly quiet: QuietWait
  readonly load1After: number
  /** Average cores used by everything else on the machine during the measured interval. */
  readonly otherCoresDuring: number | undefined
  readonly checkpointed: boolean
  readonly walBytesPerJob: number
  readonly cpuMsPer1000Jobs: { readonly node: number | undefined; readonly postgres: number | undefined }
  readonly correctness: Correctness
  readonly drain?: DrainTimes | undefined
  readonly latency?: Latencies | undefined
  readonly calls?: Timed["calls"]
  readonly tables?: Record<string, TableDelta> | undefined
  readonly deadTuplesPerJob?: number | undefined
  readonly shutdownMs?: number | undefined
  /** Top statements by server time over the measured interval (`--statements`). */
  readonly statements?: ReadonlyArray<Statement> | undefined
}

const minute = 60_000

/** The measured interval: quiet wait, CHECKPOINT, readings before and after `body`. */
const measure = <A, E>(ctx: PhaseContext, body: Effect.Effect<A, E>, childPids: ChildPids = ctx.child.pid) =>
  Effect.gen(function* () {
    const quiet = yield* Effect.promise(() =>
      waitQuiet(ctx.hygiene.maxOtherCores, ctx.hygiene.maxQuietWaitMs, ctx.postmasterPid, childPids)
    )
    const checkpointed = yield* checkpoint(ctx.serverUrl)
    if (ctx.statements) yield* resetStatements(ctx.serverUrl)
    const lsn = yield* currentLsn(ctx.serverUrl)
    const cpu0 = readCpu(ctx.postmasterPid, childPids)
    const value = yield* body
    const cpu1 = readCpu(ctx.postmasterPid, childPids)
    const lsn1 = yield* currentLsn(ctx.serverUrl)
    const wal = yield* walBytes(ctx.serverUrl, lsn, lsn1)
    const statements: ReadonlyArray<Statement> | undefined = ctx.statements
      ? yield* topStatements(ctx.serverUrl, ctx.dbUrl, 1)
      : undefined
    return { value, quiet, checkpointed, wal, cpu: cpuDelta(cpu0, cpu1), statements }
  })

type Measured = Effect.Success<ReturnType<typeof measure>>

const common = (
  ctx: PhaseContext,
  phase: PhaseName,
  jobs: number,
  ms: number,
  m: Omit<Measured, "value">,
  correctness: Correctness
) => ({
  phase,
  system: ctx.label,
  ...(ctx.profile === undefined ? {} : { profile: ctx.profile }),
  server: ctx.server,
  jobs,
  seconds: round(ms / 1000, 3),
  jobsPerSec: Math.round(perJob(jobs * 1000, ms)),
  quiet: m.quiet,
  load1After: loadAverage()[0]!,
  otherCoresDuring: m.cpu.otherCores === undefined ? undefined : round(m.cpu.otherCores),
  checkpointed: m.checkpointed,
  walBytesPerJob: Math.round(perJob(m.wal, jobs)),
  cpuMsPer1000Jobs: {
    node: m.cpu.child === undefined ? undefined : round(perJob(m.cpu.child * 1e6, jobs)),
    postgres: m.cpu.postgres === undefined ? undefined : round(perJob(m.cpu.postgres * 1e6, jobs))
  },
  correctness,
  statements: m.statements?.map((st) => ({
    ...st,
    msPer1000Jobs: round(perJob((st.execMs + st.planMs) * 1000, jobs), 1)
  }))
})

const checkStored = (ctx: PhaseContext, expected: number) =>
  Effect.map(
    ctx.child.call<number>({ op: "openJobs" }, 5 * minute),
    (open): Correctness => ({
      ok: open === expected,
      detail: open === expected ? `${open} jobs stored` : `expected ${expected} jobs stored, found ${open}`,
      openJobs: open
    })
  )

const checkExecuted = (ctx: PhaseContext, ranges: ReadonlyArray<{ from: number; count: number }>) =>
  Effect.gen(function* () {
    const v = yield* ctx.child.call<Verification>({ op: "verify", ranges }, minute)
    const open = yield* ctx.child.call<number>({ op: "openJobs" }, 5 * minute)
    const ok = v.executedOnce === v.expected && v.duplicates === 0 && v.outside === 0 && open === 0
    return {
      ok,
      detail: ok
        ? `${v.expected} jobs ran exactly once; none open`
        : `of ${v.expected}: ${v.executedOnce} once, ${v.missing} missing, ${v.duplicates} duplicate runs, ` +
          `${v.outside} unexpected; ${open} open`,
      verification: v,
      openJobs: open
    } satisfies Correctness
  })

/** Measured jobs use seqs from here; warm-up jobs from 0. */
const measuredFrom = 1_000_000

export const enqueueOne = (ctx: PhaseContext) =>
  Effect.gen(function* () {
    const { enqueueOne: n, enqueueOneWarm: warm } = ctx.sizes
    yield* ctx.child.call({ op: "enqueueSequential", from: 0, count: warm }, 5 * minute)
    const m = yield* measure(
      ctx,
      ctx.child.call<Timed>({ op: "enqueueSequential", from: measuredFrom, count: n }, 10 * minute)
    )
    const correctness = yield* checkStored(ctx, n + warm)
    return common(ctx, "enqueue-one", n, m.value.ms, m, correctness) satisfies PhaseResult
  })

/** `enqueue-one-8` (queues 1) and `enqueue-one-8q` (queues 8): 8 producers, one job per transaction. */
export const enqueueConcurrent = (ctx: PhaseContext, phase: "enqueue-one-8" | "enqueue-one-8q") =>
  Effect.gen(function* () {
    const { enqueueOne8: n, enqueueOne8Warm: warm } = ctx.sizes
    const producers = concurrentProducers
    const queues = phase === "enqueue-one-8" ? 1 : queueCount
    yield* ctx.child.call({ op: "enqueueConcurrent", from: 0, count: warm, producers, queues }, 5 * minute)
    const m = yield* measure(
      ctx,
      ctx.child.call<Timed>(
        { op: "enqueueConcurrent", from: measuredFrom, count: n, producers, queues },
        10 * minute
      )
    )
    const correctness = yield* checkStored(ctx, n + warm)
    return {
      ...common(ctx, phase, n, m.value.ms, m, correctness),
      producers,
      queues,
      calls: m.value.calls
    } satisfies PhaseResult
  })

export const enqueueBatch = (ctx: PhaseContext) =>
  Effect.gen(function* () {
    const { enqueueBatch: n, enqueueBatchWarm: warm, chunk } = ctx.sizes
    yield* ctx.child.call({ op: "enqueueBatches", from: 0, count: warm, chunk }, 5 * minute)
    const m = yield* measure(
      ctx,
      ctx.child.call<Timed>({ op: "enqueueBatches", from: measuredFrom, count: n, chunk }, 10 * minute)
    )
    const correctness = yield* checkStored(ctx, n + warm)
    return {
      ...common(ctx, "enqueue-batch", n, m.value.ms, m, correctness),
      calls: m.value.calls
    } satisfies PhaseResult
  })

export const enqueueBulk = (ctx: PhaseContext) =>
  Effect.gen(function* () {
    const { bulk: n, bulkWarm: warm } = ctx.sizes
    yield* ctx.child.call({ op: "enqueueBatches", from: 0, count: warm, chunk: warm }, 5 * minute)
    const m = yield* measure(
      ctx,
      ctx.child.call<Timed>({ op: "enqueueBatches", from: measuredFrom, count: n, chunk: n }, 10 * minute)
    )
    const correctness = yield* checkStored(ctx, n + warm)
    return common(ctx, "enqueue-bulk", n, m.value.ms, m, correctness) satisfies PhaseResult
  })

/**
 * A backend flushes its table statistics when it exits, or when idle, at most once a second; one
 * that flushed less than a second ago waits for its 10 s idle timeout (PG 15+). So statistics
 * are read 1.5 s after the child closed its connections, or 10.5 s after its last activity.
 */
const statsSettleMs = 1_500
const statsIdleFlushMs = 10_500

const tableDeltas = (
  before: Record<string, TableStats>,
  after: Record<string, TableStats>,
  jobs: number
): Record<string, TableDelta> => {
  const out: Record<string, TableDelta> = {}
  for (const [table, a] of Object.entries(after)) {
    const b = before[table] ?? { ins: 0, upd: 0, hotUpd: 0, del: 0, dead: 0, live: 0, vacuums: 0 }
    const delta: TableDelta = {
      insPerJob: round(perJob(a.ins - b.ins, jobs), 3),
      updPerJob: round(perJob(a.upd - b.upd, jobs), 3),
      delPerJob: round(perJob(a.del - b.del, jobs), 3),
      deadPerJob: round(perJob(a.dead - b.dead, jobs), 3),
      deadAfter: a.dead,
      vacuumed: a.vacuums > b.vacuums
    }
    if (delta.insPerJob + delta.updPerJob + delta.delPerJob !== 0 || delta.deadPerJob !== 0 || delta.vacuumed)
      out[table] = delta
  }
  return out
}

/**
 * Drain: warm-up (a small batch through a start/stop cycle of the workers), the backlog enqueued
 * in chunks, `ANALYZE`, then start the workers and time until storage shows every job completed.
 * Table statistics are read after the child closed its connections (so backends flushed them).
 * `closeChild` closes the child's connections (ends its process).
 */
export const drain = (ctx: PhaseContext, closeChild: Effect.Effect<void>) =>
  Effect.gen(function* () {
    const { drain: n, drainWarm: warm, chunk } = ctx.sizes
    yield* ctx.child.call({ op: "enqueueBatches", from: 0, count: warm, chunk }, 5 * minute)
    yield* ctx.child.call({ op: "runUntilDone", expected: warm, timeoutMs: 5 * minute }, 6 * minute)
    yield* ctx.child.call({ op: "stopWorkers" }, 2 * minute)
    yield* ctx.child.call({ op: "enqueueBatches", from: measuredFrom, count: n, chunk }, 10 * minute)
    yield* analyze(ctx.dbUrl)
    yield* Effect.sleep(statsIdleFlushMs)
    const before = yield* tableStats(ctx.dbUrl)
    const m = yield* measure(
      ctx,
      ctx.child.call<DrainTimes>({ op: "runUntilDone", expected: n, timeoutMs: 10 * minute }, 11 * minute)
    )
    const shutdown = yield* ctx.child.call<Timed>({ op: "stopWorkers" }, 2 * minute)
    const correctness = yield* checkExecuted(ctx, [
      { from: 0, count: warm },
      { from: measuredFrom, count: n }
    ])
    yield* closeChild
    yield* Effect.sleep(statsSettleMs)
    const after = yield* tableStats(ctx.dbUrl)
    const tables = tableDeltas(before, after, n)
    return {
      ...common(ctx, "drain", n, m.value.ms, m, correctness),
      drain: {
        ms: round(m.value.ms, 1),
        firstStartMs: round(m.value.firstStartMs, 1),
        lastStartMs: round(m.value.lastStartMs, 1),
        settleMs: round(m.value.settleMs, 1)
      },
      tables,
      deadTuplesPerJob: round(
        Object.values(tables).reduce((s, t) => s + t.deadPerJob, 0),
        3
      ),
      shutdownMs: Math.round(shutdown.ms)
    } satisfies PhaseResult
  })

/** Latency: idle workers, a warm-up burst at the same rate, then the measured offer. */
export const latency = (ctx: PhaseContext) =>
  Effect.gen(function* () {
    const { rate, latencySeconds, latencyWarmSeconds } = ctx.sizes
    const warm = Math.round(rate * latencyWarmSeconds)
    const n = Math.round(rate * latencySeconds)
    yield* ctx.child.call({ op: "startWorkers" }, minute)
    yield* Effect.sleep(1000)
    yield* ctx.child.call(
      { op: "offer", from: 0, rate, seconds: latencyWarmSeconds, timeoutMs: minute },
      3 * minute
    )
    const m = yield* measure(
      ctx,
      ctx.child.call<Latencies>(
        { op: "offer", from: measuredFrom, rate, seconds: latencySeconds, timeoutMs: minute },
        latencySeconds * 1000 + 3 * minute
      )
    )
    const shutdown = yield* ctx.child.call<Timed>({ op: "stopWorkers" }, 2 * minute)
    const correctness = yield* checkExecuted(ctx, [
      { from: 0, count: warm },
      { from: measuredFrom, count: n }
    ])
    // throughput here is the offered rate; the interval includes the wait for the last pickups
    return {
      ...common(ctx, "latency", n, latencySeconds * 1000, m, correctness),
      latency: m.value,
      shutdownMs: Math.round(shutdown.ms)
    } satisfies PhaseResult
  })

/**
 * Scale-out: the drain's workload with `processes` worker processes on one database, the 50 jobs
 * in flight split between them (`shares`). The backlog is enqueued by the first process. The
 * orchestrator times from the calls that start every process's workers until the processes'
 * handler starts add up to the backlog (polled over IPC every 10 ms) and then their acknowledged
 * completions do (a system that counts them, `SystemAdapter.completions`), else storage shows none
 * open; so even the one-process figure is timed differently from `drain` (and without its table
 * statistics). Exactly once: handler starts per seq summed over the processes.
 */
export const scale = (ctx: PhaseContext, processes: number) =>
  Effect.gen(function* () {
    const { drain: n, drainWarm: warm, chunk } = ctx.sizes
    // the other processes start side by side (each child's start-up is ~1-3 s of module loading)
    const more = yield* Effect.forEach(Array.from({ length: processes - 1 }), () => ctx.spawnMore, {
      concurrency: "unbounded"
    })
    const children: ReadonlyArray<Child> = [ctx.child, ...more]
    const split = shares(inFlight, processes)
    const all = <A>(f: (child: Child, i: number) => Effect.Effect<A, ChildError>) =>
      Effect.forEach(children, f, { concurrency: "unbounded" })
    const totalStarts = Effect.map(
      all((c) => c.call<number>({ op: "total" }, minute)),
      (totals) => sum(totals)
    )
    // acknowledged completions over the processes, or undefined when the system does not count them
    const totalCompletions = Effect.map(
      all((c) => c.call<number>({ op: "completions" }, minute)),
      (counts) => (counts.some((c) => c < 0) ? undefined : sum(counts))
    )
    /** Starts every process's workers; resolves once `target` handler starts and completions (or none open). */
    const runUntil = (target: number, timeoutMs: number) =>
      Effect.gen(function* () {
        const start = now()
        yield* all((c, i) => c.call({ op: "startWorkers", concurrency: split[i] }, minute))
        while ((yield* totalStarts) < target) {
          if (now() - start > timeoutMs)
            return yield* Effect.fail(new ChildError(`scale: timed out before ${target} handler starts`))
          yield* Effect.sleep(10)
        }
        // the system's own count where it has one (storage's open jobs are checked after the
        // interval, for correctness); else storage's open jobs
        if ((yield* totalCompletions) !== undefined) {
          while (((yield* totalCompletions) ?? 0) < target) {
            if (now() - start > timeoutMs)
              return yield* Effect.fail(new ChildError(`scale: timed out before ${target} completions`))
            yield* Effect.sleep(10)
          }
          return now() - start
        }
        while ((yield* ctx.child.call<number>({ op: "openJobs" }, minute)) > 0) {
          if (now() - start > timeoutMs)
            return yield* Effect.fail(new ChildError("scale: timed out with jobs still open"))
          yield* Effect.sleep(10)
        }
        return now() - start
      })
    const stopAll = all((c) => c.call({ op: "stopWorkers" }, 2 * minute))
    yield* ctx.child.call({ op: "enqueueBatches", from: 0, count: warm, chunk }, 5 * minute)
    yield* runUntil(warm, 5 * minute)
    yield* stopAll
    yield* ctx.child.call({ op: "enqueueBatches", from: measuredFrom, count: n, chunk }, 10 * minute)
    yield* analyze(ctx.dbUrl)
    const m = yield* measure(
      ctx,
      runUntil(warm + n, 10 * minute),
      children.map((c) => c.pid)
    )
    yield* stopAll
    const ranges = [
      { from: 0, count: warm },
      { from: measuredFrom, count: n }
    ]
    const answers = yield* all((c) => c.call<Executions>({ op: "executions", ranges }, minute))
    const open = yield* ctx.child.call<number>({ op: "openJobs" }, 5 * minute)
    const v = sumExecutions(ranges, answers)
    const ok = v.executedOnce === v.expected && v.duplicates === 0 && v.outside === 0 && open === 0
    const correctness: Correctness = {
      ok,
      detail: ok
        ? `${v.expected} jobs ran exactly once over ${processes} process${processes === 1 ? "" : "es"}; none open`
        : `of ${v.expected}: ${v.executedOnce} once, ${v.missing} missing, ${v.duplicates} duplicate runs, ` +
          `${v.outside} unexpected; ${open} open`,
      verification: v,
      openJobs: open
    }
    return {
      ...common(ctx, "scale", n, m.value, m, correctness),
      processes
    } satisfies PhaseResult
  })

/** The exactly-once check of `ranges` over the handler starts of several processes. */
export const sumExecutions = (
  ranges: ReadonlyArray<{ from: number; count: number }>,
  answers: ReadonlyArray<Executions>
): Verification => {
  let executedOnce = 0
  let missing = 0
  let duplicates = 0
  let inRanges = 0
  ranges.forEach((r, ri) => {
    for (let i = 0; i < r.count; i++) {
      const c = sum(answers.map((a) => a.counts[ri]![i]!))
      inRanges += c
      if (c === 0) missing++
      else if (c === 1) executedOnce++
      else duplicates += c - 1
    }
  })
  return {
    expected: sum(ranges.map((r) => r.count)),
    executedOnce,
    missing,
    duplicates,
    outside: sum(answers.map((a) => a.total)) - inRanges
  }
}
