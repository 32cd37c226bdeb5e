/**
 * The fault suite's harness: worker processes, the scenario database, waiting, and the figures
 * every scenario reports (enqueued, completed, duplicates, lost, time to recover).
 */
import { type ChildProcess, spawn } from "node:child_process"
import { existsSync, readFileSync, writeFileSync } from "node:fs"
import { createInterface } from "node:readline"
import { fileURLToPath } from "node:url"
import { Awa } from "@awa/runtime"
import { PgClient } from "@effect/sql-pg"
import { Effect, Layer, Redacted } from "effect"
import { SqlClient } from "effect/sql"
import { eventPrefix, faultLogDdl, type WorkerConfig } from "./jobs.ts"

const workerScript = fileURLToPath(new URL("./worker-process.ts", import.meta.url))
const resultsFile = fileURLToPath(new URL("./results.json", import.meta.url))

export interface FaultEvent {
  readonly event: string
  readonly worker: string
  readonly pid: number
  /** Epoch milliseconds in the worker process. */
  readonly t: number
  readonly [key: string]: unknown
}

export interface WorkerProcess {
  readonly name: string
  readonly pid: number
  readonly child: ChildProcess
  readonly events: Array<FaultEvent>
  /** The last lines the process printed (stdout and stderr), for diagnostics. */
  readonly output: Array<string>
  /** Event-loop stalls the worker logged, in ms. */
  readonly stalls: Array<number>
  /** Set once the process has exited. */
  readonly exit: { code: number | null; signal: NodeJS.Signals | null } | undefined
  readonly exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>
}

const keepLines = 400

/** Spawns `worker-process.ts` without waiting for it (see `startWorker`). */
export const spawnWorker = (url: string, config: WorkerConfig): WorkerProcess => {
  const child = spawn(process.execPath, [workerScript], {
    env: { ...process.env, DATABASE_URL: url, AWA_FAULT_WORKER: JSON.stringify(config) },
    stdio: ["ignore", "pipe", "pipe"]
  })
  const events: Array<FaultEvent> = []
  const output: Array<string> = []
  const stalls: Array<number> = []
  const keep = (line: string) => {
    const stall = /event loop stalled for (\d+) ms/.exec(line)
    if (stall) stalls.push(Number(stall[1]))
    output.push(line)
    if (output.length > keepLines) output.shift()
  }
  createInterface({ input: child.stdout! }).on("line", (line) => {
    if (line.startsWith(eventPrefix)) events.push(JSON.parse(line.slice(eventPrefix.length)))
    else keep(line)
  })
  createInterface({ input: child.stderr! }).on("line", keep)
  const handle: { exit: WorkerProcess["exit"] } = { exit: undefined }
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
    child.once("exit", (code, signal) => {
      handle.exit = { code, signal }
      resolve({ code, signal })
    })
  )
  return {
    name: config.name,
    pid: child.pid!,
    child,
    events,
    output,
    stalls,
    get exit() {
      return handle.exit
    },
    exited
  }
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))

/** Stops a worker: SIGTERM (it drains), then SIGKILL after `graceMs`. */
export const stopWorker = async (w: WorkerProcess, graceMs = 15_000) => {
  if (w.exit !== undefined) return w.exit
  w.child.kill("SIGTERM")
  const result = await Promise.race([w.exited, sleep(graceMs).then(() => undefined)])
  if (result !== undefined) return result
  w.child.kill("SIGKILL")
  return w.exited
}

/** Describes a worker for an assertion message. */
export const describeWorker = (w: WorkerProcess, lines = 60) =>
  `--- ${w.name} (pid ${w.pid}, exit ${JSON.stringify(w.exit)}) ---\n` +
  `leader events: ${JSON.stringify(w.events.filter((e) => e.event === "leader").map((e) => [e.value, new Date(e.t).toISOString()]))}\n` +
  w.output.slice(-lines).join("\n")

/**
 * Starts worker processes in the enclosing scope and waits until each has reported `ready`.
 * They are stopped (SIGTERM, then SIGKILL) when the scope closes.
 */
export const startWorkers = (url: string, configs: ReadonlyArray<WorkerConfig>) =>
  Effect.acquireRelease(
    Effect.promise(async () => {
      const workers = configs.map((c) => spawnWorker(url, c))
      try {
        // a bound, not a margin: several Node processes loading the library at once on a loaded
        // 2-core machine have taken more than 30 s to be ready
        await Promise.all(workers.map((w) => waitForEvent(w, (e) => e.event === "ready", 120_000)))
      } catch (error) {
        await Promise.all(workers.map((w) => stopWorker(w, 2000)))
        throw new Error(`${String(error)}\n${workers.map(describeWorker).join("\n")}`)
      }
      return workers
    }),
    (workers) =>
      Effect.promise(async () => {
        await Promise.all(workers.map((w) => stopWorker(w)))
        // FAULTS_VERBOSE=1 prints what every worker logged
        if (process.env.FAULTS_VERBOSE) for (const w of workers) console.log(describeWorker(w, 400))
      })
  )

/** Resolves with the first event matching `predicate` (past or future); rejects after `timeoutMs`. */
export const waitForEvent = async (
  w: WorkerProcess,
  predicate: (e: FaultEvent) => boolean,
  timeoutMs: number
): Promise<FaultEvent> => {
  const deadline = Date.now() + timeoutMs
  while (Date.now() < deadline) {
    const found = w.events.find(predicate)
    if (found !== undefined) return found
    if (w.exit !== undefined) throw new Error(`${w.name} exited (${JSON.stringify(w.exit)}) while waited for`)
    await sleep(20)
  }
  throw new Error(`${w.name}: event not seen within ${timeoutMs} ms`)
}

/**
 * Waits until `check` holds (real time), polling every `everyMs`; returns false on timeout. A
 * failing check counts as "not yet" (the database may be down on purpose).
 */
export const eventually = <E, R>(check: Effect.Effect<boolean, E, R>, timeoutMs: number, everyMs = 100) =>
  Effect.gen(function* () {
    const attempt = Effect.catchCause(check, () => Effect.succeed(false))
    const deadline = Date.now() + timeoutMs
    while (Date.now() < deadline) {
      if (yield* attempt) return true
      yield* Effect.sleep(everyMs)
    }
    return yield* attempt
  })

/** Awa's client, storage and a `SqlClient` on `url`, for the suite itself (the producer). */
export const suiteLayer = (url: string, options: { readonly migrateOnStart?: boolean } = {}) =>
  Awa.layerPg(options).pipe(
    Layer.provideMerge(
      PgClient.layer({ url: Redacted.make(url), maxConnections: 4, applicationName: "awa-fault-suite" })
    )
  )

/** Creates `fault_log` in the database the current `SqlClient` points at. */
export const createFaultLog = Effect.flatMap(SqlClient.SqlClient, (sql) => sql.unsafe(faultLogDdl).unprepared)

/** Releases `Held` jobs (and `StaleWriter`'s later attempts): their handlers complete. */
export const release = (jobIds: ReadonlyArray<bigint>) =>
  Effect.flatMap(SqlClient.SqlClient, (sql) =>
    Effect.forEach(
      jobIds,
      (jobId) => sql`
        INSERT INTO fault_log (job_id, run_lease, attempt, kind, worker, pid, event)
        VALUES (${jobId}, 0, 0, 'release', 'suite', ${process.pid}, 'release')`,
      { discard: true }
    )
  )

/** Executions recorded so far. */
export const executions = Effect.flatMap(
  SqlClient.SqlClient,
  (sql) => sql<{ n: number }>`SELECT count(*)::int AS n FROM fault_log WHERE event = 'start'`
).pipe(Effect.map((rows) => rows[0]!.n))

/** Jobs not yet in a final state (completed, failed, cancelled). */
export const unfinished = Effect.flatMap(
  SqlClient.SqlClient,
  (sql) => sql<{ n: number }>`
    SELECT count(*)::int AS n FROM awa.jobs WHERE state NOT IN ('completed', 'failed', 'cancelled')`
).pipe(Effect.map((rows) => rows[0]!.n))

/** `application_name`s of the sessions holding the maintenance leader's advisory lock (at most one!). */
export const leaderLockHolders = Effect.flatMap(
  SqlClient.SqlClient,
  (sql) => sql<{ name: string }>`
    WITH k AS (SELECT hashtextextended('awa:leader:awa', 0) AS key)
    SELECT a.application_name AS name
    FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid, k
    WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND l.classid = ((k.key >> 32) & 4294967295)::oid AND l.objid = (k.key & 4294967295)::oid`
).pipe(Effect.map((rows) => rows.map((r) => r.name)))

/** Epoch milliseconds of the first execution that started after `afterMs`, if any. */
export const firstExecutionAfter = (afterMs: number) =>
  Effect.flatMap(
    SqlClient.SqlClient,
    (sql) => sql<{ at: Date | null }>`
      SELECT min(at) AS at FROM fault_log WHERE event = 'start' AND at > ${new Date(afterMs)}`
  ).pipe(Effect.map((rows) => (rows[0]?.at ? rows[0].at.getTime() : undefined)))

export interface JobAccount {
  readonly jobId: bigint
  readonly kind: string
  readonly state: string
  readonly attempt: number
  readonly runLease: bigint
  readonly runAt: Date
  readonly finalizedAt: Date | null
  readonly errors: ReadonlyArray<{ error: string; attempt: number; at: string; terminal?: boolean }>
  /** Recorded executions, oldest first. */
  readonly runs: ReadonlyArray<{ runLease: bigint; attempt: number; worker: string; pid: number; at: Date }>
}

/** Every job of the scenario with its recorded executions. */
export const accounts = Effect.gen(function* () {
  const sql = yield* SqlClient.SqlClient
  const jobs = yield* sql<{
    job_id: bigint
    kind: string
    state: string
    attempt: number
    run_lease: bigint
    run_at: Date
    finalized_at: Date | null
    errors: JobAccount["errors"]
  }>`SELECT job_id, kind, state, attempt, run_lease, run_at, finalized_at, errors FROM awa.jobs ORDER BY job_id`
  const runs = yield* sql<{
    job_id: bigint
    run_lease: bigint
    attempt: number
    worker: string
    pid: number
    at: Date
  }>`SELECT job_id, run_lease, attempt, worker, pid, at FROM fault_log WHERE event = 'start' ORDER BY id`
  const byJob = new Map<bigint, Array<JobAccount["runs"][number]>>()
  for (const r of runs) {
    const list = byJob.get(r.job_id) ?? []
    list.push({ runLease: r.run_lease, attempt: r.attempt, worker: r.worker, pid: r.pid, at: r.at })
    byJob.set(r.job_id, list)
  }
  return jobs.map(
    (j): JobAccount => ({
      jobId: j.job_id,
      kind: j.kind,
      state: j.state,
      attempt: j.attempt,
      runLease: j.run_lease,
      runAt: j.run_at,
      finalizedAt: j.finalized_at,
      errors: j.errors ?? [],
      runs: byJob.get(j.job_id) ?? []
    })
  )
})

export interface Figures {
  readonly scenario: string
  readonly jobs: number
  readonly completed: number
  /** Ended failed or cancelled, as the scenario expects for some kinds. */
  readonly failed: number
  /**
   * Jobs executed again although an earlier execution had not failed by itself: its attempt was
   * rescued as stale (worker died, finalization lost) or carries no error at all.
   */
  readonly duplicates: number
  /** Those re-executions, summed over all jobs. */
  readonly extraExecutions: number
  /** Re-executions after a failure the attempt reported itself (error, defect, deadline): retries by design. */
  readonly retries: number
  /** Enqueued jobs missing, not finalized, or completed without any recorded execution. */
  readonly lost: number
  /** Scenario-specific: how long from the fault (or its end) until work resumed, in ms. */
  readonly recoveryMs: number | null
  readonly wallMs: number
  readonly notes: string
}

const final = new Set(["completed", "failed", "cancelled"])

/**
 * Counts one scenario. `enqueued` are the ids the producer got back; `logs` says whether a
 * completed job of that kind must have a recorded execution (kinds that never reach a handler
 * do not). Lost = enqueued but missing, not finalized, or "completed" without ever running.
 */
export const tally = (
  scenario: string,
  enqueued: ReadonlyArray<bigint>,
  all: ReadonlyArray<JobAccount>,
  extra: { recoveryMs: number | null; wallMs: number; notes: string; logs?: (kind: string) => boolean }
): { figures: Figures; lostJobs: ReadonlyArray<bigint> } => {
  const byId = new Map(all.map((a) => [a.jobId, a]))
  const lostJobs: Array<bigint> = []
  let completed = 0
  let failed = 0
  let duplicates = 0
  let extraExecutions = 0
  let retries = 0
  for (const id of enqueued) {
    const a = byId.get(id)
    if (a === undefined || !final.has(a.state)) {
      lostJobs.push(id)
      continue
    }
    const logs = extra.logs?.(a.kind) ?? true
    if (a.state === "completed") {
      if (logs && a.runs.length === 0) {
        lostJobs.push(id)
        continue
      }
      completed++
    } else failed++
    let again = 0
    for (const run of a.runs.slice(0, -1)) {
      const error = a.errors.find((e) => e.attempt === run.attempt)
      if (error === undefined || error.error.startsWith("heartbeat stale")) again++
      else retries++
    }
    if (again > 0) duplicates++
    extraExecutions += again
  }
  return {
    figures: {
      scenario,
      jobs: enqueued.length,
      completed,
      failed,
      duplicates,
      extraExecutions,
      retries,
      lost: lostJobs.length,
      recoveryMs: extra.recoveryMs === null ? null : Math.round(extra.recoveryMs),
      wallMs: Math.round(extra.wallMs),
      notes: extra.notes
    },
    lostJobs
  }
}

/** Merges one scenario's figures into `results.json` (git-ignored) and prints them. */
export const report = (key: string, figures: Figures) =>
  Effect.sync(() => {
    const existing = existsSync(resultsFile)
      ? (JSON.parse(readFileSync(resultsFile, "utf8")) as { scenarios?: Record<string, Figures> })
      : {}
    const scenarios = { ...existing.scenarios, [key]: figures }
    writeFileSync(
      resultsFile,
      `${JSON.stringify({ updatedAt: new Date().toISOString(), node: process.version, scenarios }, null, 2)}\n`
    )
    console.log(`[faults] ${key}: ${JSON.stringify(figures)}`)
  })
