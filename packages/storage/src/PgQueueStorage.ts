/**
 * `QueueStorage` on Postgres: the append-only ring engine of storage-engine.md, as installed by
 * `@awa/sql` migrations 0002–0003. This module is the only TypeScript that touches job tables;
 * each method is one round trip to one SQL function whose header comment (in the migration)
 * states its locks, guard and writes.
 *
 * **Guarantees** see `QueueStorage`. `enqueueMany` uses whatever connection the current fiber
 * holds, so inside `sql.withTransaction` it joins that transaction; batches larger than
 * `enqueueChunkSize` are split into several calls inside one (nested) transaction, so any size
 * is all-or-nothing with no parameter-count ceiling (rows travel as one jsonb document).
 *
 * **Gotchas** Timestamps come from the database clock (`now()` of the transaction); the worker
 * sends durations. `int8` ids are `bigint` throughout.
 */
import {
  AwaConfigError,
  CanonicalJson,
  type CheckedJob,
  CheckMemo,
  checkNewJobSync,
  checkQueueName,
  InvalidTransition,
  JobNotFound,
  type JobState,
  limits,
  type NewJob,
  type ReadCommittedRequired,
  UniqueConflict,
  UniqueKey,
  ValidationError
} from "@awa/core"
import { Migrations } from "@awa/sql"
import { Clock, Effect, Fiber, Layer, Option } from "effect"
import { SqlClient, SqlError } from "effect/sql"
import * as HotConnections from "./HotConnections.ts"
import {
  type AttemptToken,
  type AttemptView,
  type BulkProgress,
  type ClaimedJob,
  type ClaimParams,
  type DlqEntry,
  type DlqFilter,
  type DlqRetryOverrides,
  type EnqueuedJob,
  type FinalizedCounts,
  type FinalizeItem,
  type FinalizeResult,
  type HeartbeatItem,
  type HistoryBucket,
  type JobDetail,
  type JobView,
  type LedgerTrim,
  type ListFilter,
  type PruneOutcome,
  type PruneParams,
  type PruneState,
  type QueueHistoryOptions,
  type QueueHistoryReport,
  type QueueRates,
  type QueueSettings,
  type QueueStateCount,
  type QueueStatsOptions,
  type QueueStatsReport,
  QueueStorage,
  type RatesSpan,
  type RescuedAttempt,
  type RotateOutcome,
  type RotatePolicy,
  type SampleParams
} from "./QueueStorage.ts"
import * as ReadCommitted from "./ReadCommitted.ts"
import {
  checkHistoryOptions,
  historyBucketMsRange,
  historyWindowMsRange,
  ratesStaleness,
  toRates
} from "./StatSamples.ts"
import {
  checkBulkFilter,
  checkDlqLimit,
  checkFinalizeItems,
  checkInteger,
  checkListLimit,
  checkStatsWindow,
  maxClaimBatch,
  maxDlqRetentionMs,
  maxEnqueueShards,
  maxErrorMessageLength,
  pruneCarryAfterMsRange,
  rotateMaxAgeMsRange,
  rotateMinRowsRange,
  statsStaleness,
  statsWindowMsRange
} from "./StorageChecks.ts"
import { wakeChannel } from "./StorageSignals.ts"

export interface PgQueueStorageOptions {
  /** Schema Awa is installed in. Default `"awa"`. */
  readonly schema?: string | undefined
  /** Largest encoded args accepted at enqueue. Default 1 MiB. */
  readonly maxArgsBytes?: number | undefined
  /** Rows per enqueue call; larger batches are split inside one transaction. Default 5,000. */
  readonly enqueueChunkSize?: number | undefined
  /** How long prune keeps trying for its `ACCESS EXCLUSIVE` lock (never queued). Default 10 ms (1–1000). */
  readonly pruneLockTimeoutMs?: number | undefined
  /**
   * `rotate` moves the queue ring on once its current slot holds this many ready rows, or is
   * `rotateMaxAgeMs` old (the leader calls it every `rotateInterval`). Every rotation costs a prune,
   * whose TRUNCATE stalls claims and completions for some milliseconds whatever the slot's size, so
   * at low rates fewer, fuller slots mean fewer stalls and less catalog churn. Default 10,000
   * (1–10,000,000); 1 rotates whenever the slot has rows, as before migration 0013. The worker's
   * `maintenance.rotateMinRows` overrides it for the leader's calls (`rotateWhenDue`).
   */
  readonly rotateMinRows?: number | undefined
  /**
   * See `rotateMinRows`. Default 10,000 ms (0–3,600,000); the worker's `maintenance.rotateMaxAge`
   * overrides it.
   */
  readonly rotateMaxAgeMs?: number | undefined
  /**
   * Prune carries a sealed slot's open attempts forward so that long-running attempts never hold
   * up rotation, but it leaves the slot alone (`Blocked: young_attempts`) while any of them was
   * claimed less than this long ago: those will most likely close by themselves, and carrying
   * them mid-drain makes their finalizers wait (migration 0014). Default 5,000 ms (0–3,600,000;
   * 0 carries at once). The worker's `maintenance.pruneCarryAfter` overrides it for the
   * leader's calls (`PruneParams.carryAfterMs`).
   */
  readonly pruneCarryAfterMs?: number | undefined
  /**
   * Unclaimed rows a prune carries into the current slot (half of it per lane at most); the rest of
   * a slot's unclaimed residue is parked outside the ring and brought back in lane order. Default
   * 10,000 (0–1,000,000).
   */
  readonly pruneCarryRows?: number | undefined
  /**
   * When a forced prune still cannot lock its slot, sessions idle in transaction for longer than
   * this that hold a lock on the slot are ended (`pg_terminate_backend`); running statements are
   * never touched. Default 60,000 ms (0–86,400,000; 0 never ends a session).
   */
  readonly pruneEndIdleBlockersAfterMs?: number | undefined
  /**
   * Run `claim` and `finalize` on connections of the layer's own (`HotConnections`: up to two,
   * opened on first use, outside the application's pool), so that one or two backends plan them
   * instead of every pooled connection after every prune (ADR 0033). A call that finds them
   * busy, or runs inside the caller's transaction, goes through the pool. Uses the
   * `HotConnections` in context when there is one (`Awa.layerPg` shares one with the key-grant
   * layer). Needs the application's `PgClient`; with any other `SqlClient` every call goes
   * through it. Default `true`.
   */
  readonly hotConnections?: boolean | undefined
}

// Jobs (or DLQ entries) per transaction of a bulk action: a few hundred row writes and no per-job
// lock, so the shared lock table never fills, whatever the size of the queue (migration 0027).
const bulkBatch = 500

// SQLSTATE the operator retries (retry_job, retry_from_dlq) raise for a unique conflict (DETAIL =
// key, HINT = holder). The enqueue functions answer state 'duplicate' instead (migration 0018).
const uniqueConflictCode = "AWU01"

interface JobRow {
  readonly job_id: bigint
  readonly state: JobState
  readonly kind: string
  readonly queue: string
  readonly priority: number
  readonly args: unknown
  readonly metadata: Record<string, unknown>
  readonly tags: ReadonlyArray<string>
  readonly errors: ReadonlyArray<any>
  readonly progress: unknown
  readonly attempt: number
  readonly max_attempts: number
  readonly run_lease: bigint
  readonly run_at: Date
  readonly created_at: Date
  readonly finalized_at: Date | null
  readonly dlq_reason: string | null
}

const toView = (row: JobRow): JobView => ({
  id: row.job_id,
  kind: row.kind,
  queue: row.queue,
  priority: row.priority,
  state: row.state,
  attempt: row.attempt,
  maxAttempts: row.max_attempts,
  runLease: row.run_lease,
  args: row.args,
  metadata: row.metadata,
  tags: row.tags,
  errors: row.errors,
  progress: row.progress ?? null,
  runAt: row.run_at,
  createdAt: row.created_at,
  finalizedAt: row.finalized_at,
  dlqReason: row.dlq_reason
})

interface DlqRow {
  readonly job_id: bigint
  readonly kind: string
  readonly queue: string
  readonly priority: number
  readonly args: unknown
  readonly metadata: Record<string, unknown>
  readonly tags: ReadonlyArray<string>
  readonly errors: ReadonlyArray<any>
  readonly progress: unknown
  readonly attempt: number
  readonly max_attempts: number
  readonly original_run_lease: bigint
  readonly run_at: Date
  readonly created_at: Date
  readonly dlq_at: Date
  readonly dlq_reason: string
}

const toDlqEntry = (row: DlqRow): DlqEntry => ({
  id: row.job_id,
  kind: row.kind,
  queue: row.queue,
  priority: row.priority,
  args: row.args,
  metadata: row.metadata,
  tags: row.tags,
  errors: row.errors,
  progress: row.progress ?? null,
  attempt: row.attempt,
  maxAttempts: row.max_attempts,
  originalRunLease: row.original_run_lease,
  runAt: row.run_at,
  createdAt: row.created_at,
  dlqAt: row.dlq_at,
  reason: row.dlq_reason
})

const pgErrorField = (error: SqlError.SqlError, field: "code" | "detail" | "hint"): string | undefined => {
  const cause = (error.reason as { cause?: Record<string, unknown> }).cause
  const value = cause?.[field]
  return typeof value === "string" ? value : undefined
}

/** Maps the SQL functions' unique-conflict SQLSTATE to the typed error; other errors pass through. */
const mapUniqueConflict = <A, E, R>(
  effect: Effect.Effect<A, E, R>
): Effect.Effect<A, E | UniqueConflict, R> =>
  Effect.catch(
    effect,
    (error): Effect.Effect<never, E | UniqueConflict> =>
      SqlError.isSqlError(error) && pgErrorField(error, "code") === uniqueConflictCode
        ? Effect.fail(
            new UniqueConflict({
              key: pgErrorField(error, "detail") ?? "",
              existingJobId: BigInt(pgErrorField(error, "hint") ?? "0")
            })
          )
        : Effect.fail(error)
  )

const outcomeJson = (item: FinalizeItem): string => {
  const o = item.outcome
  // progress rides with the outcome (migration 0022); completion clears it, so it is not sent
  const base =
    item.progress == null || o._tag === "Complete"
      ? `"job_id":${item.jobId},"run_lease":${item.runLease}`
      : `"job_id":${item.jobId},"run_lease":${item.runLease},"progress":${JSON.stringify(item.progress)}`
  switch (o._tag) {
    case "Complete":
      return `{${base},"outcome":"complete"}`
    case "Retry":
      return `{${base},"outcome":"retry","delay_ms":${o.delayMs},"message":${JSON.stringify(o.error.slice(0, maxErrorMessageLength))}}`
    case "Snooze":
      return `{${base},"outcome":"snooze","delay_ms":${o.delayMs}}`
    case "Release":
      return `{${base},"outcome":"release","delay_ms":${o.delayMs},"message":${JSON.stringify(o.error.slice(0, maxErrorMessageLength))}}`
    case "Cancel":
      return `{${base},"outcome":"cancel","message":${JSON.stringify(o.reason.slice(0, maxErrorMessageLength))}}`
    case "Fail":
      return `{${base},"outcome":"fail","message":${JSON.stringify(o.error.slice(0, maxErrorMessageLength))}}`
  }
}

/** Every applied completion's answer, shared: results are read, never changed. */
const completedResult: FinalizeResult = { _tag: "Applied", state: "completed" }
const staleResult: FinalizeResult = { _tag: "Stale" }

/** A `bigint[]` literal (`{1,2,3}`) of one field of each item: sent as text, cast by the statement. */
const bigintArray = <A>(items: ReadonlyArray<A>, field: (item: A) => bigint): string => {
  let literal = "{"
  for (let i = 0; i < items.length; i++) literal += i === 0 ? `${field(items[i]!)}` : `,${field(items[i]!)}`
  return `${literal}}`
}

/** The SQL enqueue function's lane lock order: queue in UTF-8 byte order (`COLLATE "C"`), then priority. */
const compareLane = (a: { queue: string; priority: number }, b: { queue: string; priority: number }) =>
  CanonicalJson.compareUtf8(a.queue, b.queue) || a.priority - b.priority

const pruneOutcome = (
  row: { outcome: string; generation: bigint | null; carried: number } | undefined
): PruneOutcome => {
  if (row === undefined || row.outcome === "Noop") return { _tag: "Noop" }
  if (row.outcome === "Pruned")
    return { _tag: "Pruned", generation: row.generation ?? 0n, carried: row.carried }
  const reason = row.outcome.slice("Blocked:".length)
  return { _tag: "Blocked", reason: reason as Extract<PruneOutcome, { _tag: "Blocked" }>["reason"] }
}

/** One `enqueue_batch` call's arguments (see migration 0012). */
interface BatchChunk {
  readonly jobs: ReadonlyArray<CheckedJob>
  /** JSON array of the distinct headers. */
  readonly headers: string
  /** JSON array of the jobs' args. */
  readonly args: string
  /** Header index of each job. */
  readonly headerIndex: ReadonlyArray<number>
  /** `headerIndex` as an int[] literal, or null when every job uses header 0. */
  readonly headerOf: string | null
  /** JSON array of unique keys (hex or null), or null when no job has one. */
  readonly keys: string | null
}

const sameHeader = (a: CheckedJob, b: CheckedJob) =>
  a.kind === b.kind &&
  a.queue === b.queue &&
  a.priority === b.priority &&
  a.maxAttempts === b.maxAttempts &&
  a.uniqueStates === b.uniqueStates &&
  a.metadataJson === b.metadataJson &&
  (a.tags === b.tags || (a.tags.length === b.tags.length && a.tags.every((t, i) => t === b.tags[i]))) &&
  (a.runAt === b.runAt ||
    (a.runAt !== undefined && b.runAt !== undefined && a.runAt.getTime() === b.runAt.getTime()))

const headerJson = (job: CheckedJob) =>
  `{"kind":${JSON.stringify(job.kind)},"queue":${JSON.stringify(job.queue)},"priority":${job.priority},` +
  `"metadata":${job.metadataJson},"tags":${JSON.stringify(job.tags)},"max_attempts":${job.maxAttempts},` +
  `"run_at":${job.runAt ? JSON.stringify(job.runAt.toISOString()) : "null"},"unique_states":${job.uniqueStates}}`

const batchChunk = (jobs: ReadonlyArray<CheckedJob>): BatchChunk => {
  const headers: Array<string> = []
  const headerIds = new Map<string, number>()
  const headerIndex = new Array<number>(jobs.length)
  let args = "["
  let keys: Array<string> | undefined
  let mixed = false
  for (let i = 0; i < jobs.length; i++) {
    const job = jobs[i]!
    let h: number
    if (i > 0 && sameHeader(jobs[i - 1]!, job)) h = headerIndex[i - 1]!
    else {
      const json = headerJson(job)
      const known = headerIds.get(json)
      if (known === undefined) {
        h = headers.length
        headers.push(json)
        headerIds.set(json, h)
      } else h = known
    }
    headerIndex[i] = h
    if (h !== 0) mixed = true
    if (i > 0) args += ","
    args += job.argsJson
    if (job.uniqueKey !== undefined) {
      keys ??= new Array<string>(i).fill("null")
      keys.push(`"${UniqueKey.toHex(job.uniqueKey)}"`)
    } else keys?.push("null")
  }
  return {
    jobs,
    headers: `[${headers.join(",")}]`,
    args: `${args}]`,
    headerIndex,
    headerOf: mixed ? `{${headerIndex.join(",")}}` : null,
    keys: keys === undefined ? null : `[${keys.join(",")}]`
  }
}

/** Whether every job goes to the same lane (before checks: the defaults as checkNewJob fills them). */
const oneLane = (jobs: ReadonlyArray<NewJob>) => {
  const queue = jobs[0]!.queue ?? "default"
  const priority = jobs[0]!.priority ?? limits.defaultPriority
  return jobs.every(
    (j) => (j.queue ?? "default") === queue && (j.priority ?? limits.defaultPriority) === priority
  )
}

/** Indexes of `jobs` sorted by lane (the SQL lock order), stable. */
const sortedByLane = (jobs: ReadonlyArray<CheckedJob>): ReadonlyArray<number> => {
  const order = jobs.map((_, i) => i)
  const first = jobs[0]!
  if (jobs.every((j) => j.queue === first.queue && j.priority === first.priority)) return order
  return order.sort((a, b) => compareLane(jobs[a]!, jobs[b]!) || a - b)
}

/**
 * A row of `claim` (and of `claim_keyed`, `claim_resumed`): the claimed attempt as stored. Since
 * migration 0061 claim and claim_keyed answer lean rows: `metadata`, `tags` and `errors` are NULL
 * when empty, `run_at` is NULL when it equals `created_at`, and the call's `claimed_at` and
 * `deadline_at` come on the first row of each statement's answer only (NULL after it).
 * `claimedJobsOf` restores them.
 */
export interface ClaimRow {
  readonly job_id: bigint
  readonly run_lease: bigint
  readonly attempt: number
  readonly max_attempts: number
  readonly kind: string
  readonly queue: string
  readonly priority: number
  readonly args: unknown
  readonly metadata: Record<string, unknown> | null
  readonly tags: Array<string> | null
  readonly errors: Array<any> | null
  readonly run_at: Date | null
  readonly created_at: Date
  readonly claimed_at: Date | null
  readonly deadline_at: Date | null
  readonly progress: Record<string, unknown> | null
}

/** The claimed attempt a worker receives, from its row and its claim call's times. */
const claimedJobFrom = (r: ClaimRow, claimedAt: Date, deadlineAt: Date | null): ClaimedJob => ({
  jobId: r.job_id,
  runLease: r.run_lease,
  kind: r.kind,
  queue: r.queue,
  priority: r.priority,
  attempt: r.attempt,
  maxAttempts: r.max_attempts,
  args: r.args,
  metadata: r.metadata ?? {},
  tags: r.tags ?? [],
  errors: r.errors ?? [],
  runAt: r.run_at ?? new Date(r.created_at.getTime()),
  createdAt: r.created_at,
  claimedAt,
  deadlineAt,
  progress: r.progress
})

/**
 * The claimed attempts a worker receives, from a claim's rows in their order: a row without
 * `claimed_at` has its call's times from the row before it that carried them (0061). The jobs of
 * one call share those two `Date`s, as they share the instants.
 */
export const claimedJobsOf = (rows: ReadonlyArray<ClaimRow>): Array<ClaimedJob> => {
  const jobs = new Array<ClaimedJob>(rows.length)
  let claimedAt: Date | null = null
  let deadlineAt: Date | null = null
  for (let i = 0; i < rows.length; i++) {
    const row = rows[i]!
    if (row.claimed_at !== null) {
      claimedAt = row.claimed_at
      deadlineAt = row.deadline_at
    } else if (claimedAt === null) {
      // every statement's first row carries the call's times: this is a bug in the SQL
      throw new Error(`claim answered job ${row.job_id} without its call's claimed_at`)
    }
    jobs[i] = claimedJobFrom(row, claimedAt, deadlineAt)
  }
  return jobs
}

export const make = Effect.fnUntraced(function* (options: PgQueueStorageOptions = {}) {
  const sql = yield* SqlClient.SqlClient
  const schema = yield* Migrations.checkSchemaName(options.schema ?? Migrations.defaultSchema)
  const s = sql(schema)
  // calls whose SQL functions need READ COMMITTED (migration 0027)
  const rc = ReadCommitted.make(sql)
  const chunkSize = options.enqueueChunkSize ?? 5000
  const lockTimeoutMs = options.pruneLockTimeoutMs ?? 10
  // 0 would mean no lock_timeout: a queued ACCESS EXCLUSIVE request would stall every claimer.
  if (!(Number.isInteger(lockTimeoutMs) && lockTimeoutMs >= 1 && lockTimeoutMs <= 1000)) {
    return yield* new AwaConfigError({
      issues: [{ path: "pruneLockTimeoutMs", reason: "must be an integer 1–1000" }]
    })
  }

  // The layer's maintenance policy; the worker's `maintenance` options override it per call.
  const layerOption = (
    path: string,
    value: number,
    range: { readonly min: number; readonly max: number }
  ): Effect.Effect<number, AwaConfigError> =>
    Number.isInteger(value) && value >= range.min && value <= range.max
      ? Effect.succeed(value)
      : Effect.fail(
          new AwaConfigError({
            issues: [
              {
                path,
                reason: `must be an integer ${range.min.toLocaleString("en-US")}–${range.max.toLocaleString("en-US")}`
              }
            ]
          })
        )
  const rotateMinRows = yield* layerOption(
    "rotateMinRows",
    options.rotateMinRows ?? rotateMinRowsRange.default,
    rotateMinRowsRange
  )
  const rotateMaxAgeMs = yield* layerOption(
    "rotateMaxAgeMs",
    options.rotateMaxAgeMs ?? rotateMaxAgeMsRange.default,
    rotateMaxAgeMsRange
  )
  const carryAfterMs = yield* layerOption(
    "pruneCarryAfterMs",
    options.pruneCarryAfterMs ?? pruneCarryAfterMsRange.default,
    pruneCarryAfterMsRange
  )

  const carryRows = yield* layerOption("pruneCarryRows", options.pruneCarryRows ?? 10_000, {
    min: 0,
    max: 1_000_000
  })
  const endIdleAfterMs = yield* layerOption(
    "pruneEndIdleBlockersAfterMs",
    options.pruneEndIdleBlockersAfterMs ?? 60_000,
    { min: 0, max: 86_400_000 }
  )

  // One job: typed parameters, no JSON document to build or parse. A held unique key is a state
  // of the answer, not a server error (migration 0018): nothing was written.
  const enqueueOne = (job: CheckedJob) =>
    Effect.flatMap(
      sql<{ job_id: bigint | null; state: "available" | "scheduled" | "duplicate" }>`
        SELECT job_id, state FROM ${s}.enqueue_one(${job.kind}, ${job.queue}, ${job.priority}, ${job.argsJson}::jsonb,
          ${job.metadataJson}::jsonb, ${job.tags.length === 0 ? null : JSON.stringify(job.tags)}::jsonb,
          ${job.maxAttempts}, ${job.runAt ?? null}::timestamptz, ${job.uniqueKey ?? null}::bytea, ${job.uniqueStates})`,
      ([row]): Effect.Effect<ReadonlyArray<EnqueuedJob>, UniqueConflict> =>
        row!.state === "duplicate"
          ? Effect.fail(
              new UniqueConflict({ key: UniqueKey.toHex(job.uniqueKey!), existingJobId: row!.job_id ?? 0n })
            )
          : Effect.succeed([{ id: row!.job_id!, state: row!.state, queue: job.queue }])
    )

  // Several jobs: what they share (kind, queue, priority, metadata, tags, options) travels once
  // per distinct header; per job only its args, its header index and its unique key.
  // A lost unique key comes back as conflict_key/conflict_holder with nothing written (0018).
  const enqueueChunk = (chunk: BatchChunk) =>
    Effect.flatMap(
      sql<{
        job_ids: ReadonlyArray<bigint> | null
        scheduled_headers: ReadonlyArray<number> | null
        conflict_key: string | null
        conflict_holder: bigint | null
      }>`
        SELECT job_ids, scheduled_headers, conflict_key, conflict_holder FROM ${s}.enqueue_batch(${chunk.headers}::jsonb,
          ${chunk.args}::jsonb, ${chunk.headerOf}::int[], ${chunk.keys}::jsonb)`,
      ([row]): Effect.Effect<ReadonlyArray<EnqueuedJob>, UniqueConflict> => {
        const { job_ids: ids, scheduled_headers: scheduled, conflict_key: key } = row!
        if (key !== null || ids === null)
          return Effect.fail(
            new UniqueConflict({ key: key ?? "", existingJobId: row!.conflict_holder ?? 0n })
          )
        return Effect.succeed(
          chunk.jobs.map((job, i) => ({
            id: BigInt(ids[i]!),
            state: scheduled?.includes(chunk.headerIndex[i]!) ? "scheduled" : "available",
            queue: job.queue
          }))
        )
      }
    )

  const checkAll = (jobs: ReadonlyArray<NewJob>, nowMillis: number) => {
    const memo = new CheckMemo()
    const checked = new Array<CheckedJob>(jobs.length)
    for (let i = 0; i < jobs.length; i++) {
      const result = checkNewJobSync(jobs[i]!, { nowMillis, maxArgsBytes: options.maxArgsBytes }, memo)
      if (result instanceof ValidationError) return result
      checked[i] = result
    }
    return checked
  }

  /**
   * Several calls in one transaction, pipelined: chunk c + 1 is checked and rendered while the
   * server inserts chunk c (one call in flight on the transaction's connection at a time, so the
   * calls run in order). A chunk that fails its checks fails the whole batch once the call in
   * flight has returned; the transaction (or the caller's savepoint) then rolls back what went in.
   */
  const enqueueChunks = (count: number, chunkAt: (c: number) => BatchChunk | ValidationError) =>
    sql.withTransaction(
      Effect.gen(function* () {
        const out: Array<ReadonlyArray<EnqueuedJob>> = []
        let inFlight: Fiber.Fiber<ReadonlyArray<EnqueuedJob>, SqlError.SqlError | UniqueConflict> | undefined
        for (let c = 0; c < count; c++) {
          const chunk = chunkAt(c)
          if (inFlight !== undefined) out.push(yield* Fiber.join(inFlight))
          if (chunk instanceof ValidationError) return yield* chunk
          inFlight = yield* Effect.forkChild(enqueueChunk(chunk), { startImmediately: true })
        }
        if (inFlight !== undefined) out.push(yield* Fiber.join(inFlight))
        return out.flat()
      })
    )

  const enqueueMany = (jobs: ReadonlyArray<NewJob>) =>
    Effect.gen(function* () {
      if (jobs.length === 0) return []
      const nowMillis = yield* Clock.currentTimeMillis
      if (jobs.length <= chunkSize) {
        const checked = checkAll(jobs, nowMillis)
        if (checked instanceof ValidationError) return yield* checked
        return checked.length === 1
          ? yield* enqueueOne(checked[0]!)
          : yield* enqueueChunk(batchChunk(checked))
      }
      const chunks = Math.ceil(jobs.length / chunkSize)
      if (oneLane(jobs)) {
        // One lane (an insertMany): input order is lock order, each chunk is checked in its turn.
        return yield* enqueueChunks(chunks, (c) => {
          const checked = checkAll(jobs.slice(c * chunkSize, (c + 1) * chunkSize), nowMillis)
          return checked instanceof ValidationError ? checked : batchChunk(checked)
        })
      }
      // Several lanes: each call locks its lanes in sorted order, so the rows are sorted by lane
      // first (stable: FIFO inside a lane is kept). Then every lock is taken in one global order
      // across the chunks, and two multi-chunk producers cannot deadlock. Sorting needs every
      // job checked first.
      const checked = checkAll(jobs, nowMillis)
      if (checked instanceof ValidationError) return yield* checked
      const order = sortedByLane(checked)
      const results = yield* enqueueChunks(chunks, (c) =>
        batchChunk(order.slice(c * chunkSize, (c + 1) * chunkSize).map((i) => checked[i]!))
      )
      const enqueued = new Array<EnqueuedJob>(checked.length)
      for (let k = 0; k < results.length; k++) enqueued[order[k]!] = results[k]!
      return enqueued
    }).pipe(
      // no stack trace: it would point here, not at the caller
      Effect.withSpan(
        "QueueStorage.enqueueMany",
        { attributes: { count: jobs.length } },
        { captureStackTrace: false }
      )
    )

  // The hot statements' own connections (ADR 0033): one or two backends plan them, not every
  // pooled one.
  const hot = yield* HotConnections.forLayer(options.hotConnections)

  const claim = (params: ClaimParams) =>
    Effect.gen(function* () {
      yield* checkQueueName(params.queue)
      yield* checkInteger("max", params.max, 0, maxClaimBatch)
      const statement = sql<ClaimRow>`SELECT * FROM ${s}.claim(${params.queue}, ${params.max}, ${params.deadlineMs}::bigint, ${params.agingIntervalMs}::bigint)`
      const rows = yield* hot.run(statement, rc("claim", statement))
      return claimedJobsOf(rows)
    }).pipe(ReadCommitted.mapRefusal("claim"))

  // A batch of completions (the completion batcher's usual one) goes as two arrays (migration
  // 0049): no JSON object per job to build here or to parse there. The answer comes back as one
  // row: how many items the function answered, and the positions (1-based) of the stale ones. An
  // applied completion's state is always `completed`, so a row per item (its decoding and a
  // result object per job, in a drain) would only repeat that.
  const finalizeCompletions = (items: ReadonlyArray<FinalizeItem>) =>
    Effect.gen(function* () {
      const statement = sql<{ answered: number; stale: ReadonlyArray<number> }>`
          SELECT count(*)::int AS answered,
                 coalesce(array_agg(f.ord ORDER BY f.ord) FILTER (WHERE NOT f.applied), '{}') AS stale
          FROM ${s}.finalize_completions(${bigintArray(items, (i) => i.jobId)}::bigint[], ${bigintArray(items, (i) => i.runLease)}::bigint[]) f`
      const [row] = yield* hot.run(statement, rc("finalize", statement))
      if (row === undefined || row.answered !== items.length)
        return yield* Effect.die(
          new Error(`finalize_completions answered ${row?.answered ?? 0} of ${items.length} items`)
        )
      const results = new Array<FinalizeResult>(items.length).fill(completedResult)
      for (const ord of row.stale) results[ord - 1] = staleResult
      return results
    })

  const finalizeMany = (items: ReadonlyArray<FinalizeItem>) =>
    Effect.gen(function* () {
      if (items.length === 0) return []
      yield* checkFinalizeItems(items)
      if (items.every((item) => item.outcome._tag === "Complete")) return yield* finalizeCompletions(items)
      const statement = sql<{ ord: number; applied: boolean; state: JobState | null }>`
          SELECT * FROM ${s}.finalize(${`[${items.map(outcomeJson).join(",")}]`}::jsonb)`
      const rows = yield* hot.run(statement, rc("finalize", statement))
      return rows.map(
        (row): FinalizeResult =>
          row.applied && row.state ? { _tag: "Applied", state: row.state } : { _tag: "Stale" }
      )
    }).pipe(ReadCommitted.mapRefusal("finalize"))

  const heartbeatMany = (items: ReadonlyArray<HeartbeatItem>) =>
    Effect.gen(function* () {
      if (items.length === 0) return []
      const json = items.map(
        (i) =>
          `{"job_id":${i.jobId},"run_lease":${i.runLease}${i.progress == null ? "" : `,"progress":${JSON.stringify(i.progress)}`}}`
      )
      const rows = yield* rc(
        "heartbeat",
        sql<{ job_id: bigint; run_lease: bigint }>`
          SELECT * FROM ${s}.heartbeat(${`[${json.join(",")}]`}::jsonb)`
      )
      return rows.map((r): AttemptToken => ({ jobId: r.job_id, runLease: r.run_lease }))
    })

  // Promotion, and parked rows brought back into their lanes (migration 0021) on the same
  // schedule. The answer counts promoted jobs only: the leader's loop (and the contract) read it
  // as "due jobs moved", and a refill of a parked lane is not one.
  const promoteDue = (limit: number) =>
    Effect.map(
      rc(
        "promote",
        sql<{ n: number; u: number }>`SELECT ${s}.promote(${limit}) AS n, ${s}.unpark(${limit}) AS u`
      ),
      (rows) => rows[0]?.n ?? 0
    )

  // The rescued attempts' queue and kind (for the awa.job.rescued counter) come from their claim
  // and ready rows, read in the same statement as the rescue (rescue itself is unchanged): the
  // rows are visible to it (the claims were committed before), and no prune can truncate their
  // slot before the statement's transaction ends. Rescue runs on the leader, off the hot path.
  const rescue = (kind: "stale" | "deadline", stalenessMs: number, limit: number) =>
    Effect.map(
      rc(
        "rescue",
        sql<{
          job_id: bigint
          run_lease: bigint
          state: JobState
          queue: string | null
          kind: string | null
        }>`
          SELECT x.job_id, x.run_lease, x.state, c.queue, r.kind
          FROM ${s}.rescue(${kind}, ${stalenessMs}::bigint, ${limit}) x
          LEFT JOIN LATERAL (
            SELECT c.queue, c.priority, c.shard, c.lane_seq, c.slot FROM ${s}.claims c
            WHERE c.job_id = x.job_id AND c.run_lease = x.run_lease LIMIT 1
          ) c ON true
          LEFT JOIN LATERAL (
            SELECT r.kind FROM ${s}.ready r
            WHERE r.queue = c.queue AND r.priority = c.priority AND r.shard = c.shard AND r.lane_seq = c.lane_seq
              AND r.slot = c.slot
          ) r ON true`
      ),
      (rows) =>
        rows.map(
          (r): RescuedAttempt => ({
            jobId: r.job_id,
            runLease: r.run_lease,
            state: r.state,
            reason: kind === "stale" ? "stale_heartbeat" : "deadline_exceeded",
            queue: r.queue ?? "",
            kind: r.kind ?? ""
          })
        )
    )

  const rotateRing = (ring: "queue" | "history", minAgeMs: number) =>
    Effect.map(
      rc(
        "rotate",
        sql<{ outcome: RotateOutcome }>`SELECT ${s}.rotate(${ring}, ${minAgeMs}::bigint) AS outcome`
      ),
      (rows) => rows[0]!.outcome
    )

  // The queue ring by size or age (migration 0013); minRows 1 is the eager rule of 0003.
  const rotateQueue = (minRows: number, maxAgeMs: number) =>
    minRows <= 1
      ? rotateRing("queue", 0)
      : Effect.map(
          rc(
            "rotate",
            sql<{ outcome: RotateOutcome }>`
              SELECT ${s}.rotate_queue_when_due(${minRows}, ${maxAgeMs}::bigint) AS outcome`
          ),
          (rows) => rows[0]!.outcome
        )

  const rotateWhenDue = (policy: RotatePolicy) =>
    Effect.gen(function* () {
      const minRows = policy.minRows ?? rotateMinRows
      const maxAgeMs = policy.maxAgeMs ?? rotateMaxAgeMs
      yield* checkInteger("minRows", minRows, rotateMinRowsRange.min, rotateMinRowsRange.max)
      yield* checkInteger("maxAgeMs", maxAgeMs, rotateMaxAgeMsRange.min, rotateMaxAgeMsRange.max)
      return yield* rotateQueue(minRows, maxAgeMs)
    })

  // A forced prune queues for its locks (ADR 0018); 0 = NOWAIT retries.
  const forceTimeout = (r: PruneParams) =>
    r.forceLockTimeoutMs === undefined ? 0 : Math.min(5000, Math.max(1, Math.round(r.forceLockTimeoutMs)))

  const pruneCall = (fn: "prune_queue" | "prune_history", r: PruneParams) =>
    rc(fn === "prune_queue" ? "prune" : "pruneHistory", pruneStatement(fn, r))

  const pruneStatement = (fn: "prune_queue" | "prune_history", r: PruneParams) =>
    fn === "prune_queue"
      ? sql<{ outcome: string; generation: bigint | null; carried: number }>`
          SELECT outcome, generation, carried FROM ${s}.prune_queue(${lockTimeoutMs}, ${r.completedMs}::bigint,
            ${r.failedMs}::bigint, ${r.cancelledMs}::bigint, ${r.carryAfterMs ?? carryAfterMs}::bigint,
            ${forceTimeout(r)}, ${carryRows}, ${endIdleAfterMs}::bigint)`
      : sql<{ outcome: string; generation: bigint | null; carried: number }>`
          SELECT * FROM ${s}.prune_history(${lockTimeoutMs}, ${r.completedMs}::bigint, ${r.failedMs}::bigint,
            ${r.cancelledMs}::bigint)`

  // Keys of the rows a prune dropped are released after its truncate committed, in their own
  // transaction (migration 0021: not under the exclusive lock). Records left by a crash between
  // the two go with the next prune.
  const releasePendingKeys = Effect.asVoid(rc("prune", sql`SELECT ${s}.release_pending_keys(100)`))

  // prune_queue answers 'Copied' (history rows copied ahead, migration 0013) or 'Parked' (a large
  // residue parked ahead, migration 0021) after committing work it did ahead of its exclusive
  // lock; the next call reuses it. At most one of each precedes the prune itself.
  const pruneRing = (fn: "prune_queue" | "prune_history", r: PruneParams) =>
    Effect.gen(function* () {
      for (let call = 0; call < 3; call++) {
        const [row] = yield* pruneCall(fn, r)
        if (row?.outcome !== "Copied" && row?.outcome !== "Parked") return pruneOutcome(row)
      }
      return pruneOutcome({ outcome: "Blocked:busy", generation: null, carried: 0 })
    }).pipe(
      Effect.tap(
        (outcome): Effect.Effect<void, SqlError.SqlError | ReadCommittedRequired> =>
          outcome._tag === "Pruned" ? releasePendingKeys : Effect.void
      )
    )

  // Ledger retention (migration 0017): rows below each ring's newest wrap, once a wrap has piled up.
  const trimLedgers = (batch: number) =>
    Effect.map(
      rc(
        "trimLedgers",
        sql<{ rotations: number; prunes: number; copies: number }>`
          SELECT rotations, prunes, copies FROM ${s}.trim_ledgers(${batch})`
      ),
      (rows): LedgerTrim => ({
        deleted: rows.reduce((n, r) => n + r.rotations + r.prunes + r.copies, 0),
        more: rows.some((r) => r.rotations >= batch || r.prunes >= batch || r.copies >= batch)
      })
    )

  const getJob = (id: bigint) =>
    Effect.gen(function* () {
      const rows = yield* sql<JobRow>`SELECT * FROM ${s}.jobs WHERE job_id = ${id}`
      if (rows.length === 0) return yield* new JobNotFound({ jobId: id })
      return toView(rows[0]!)
    })

  // The job page's extras: the unique key from whichever row holds the job (each source by its
  // job_id index), and its attempts from the claims and closures still stored (a carried attempt
  // has a claim row in two slots: one per run lease).
  const jobDetail = (id: bigint) =>
    Effect.gen(function* () {
      const [key] = yield* sql<{ key: string | null }>`
        SELECT encode(k.unique_key, 'hex') AS key FROM (
          SELECT unique_key FROM ${s}.ready WHERE job_id = ${id}
          UNION ALL SELECT unique_key FROM ${s}.deferred WHERE job_id = ${id}
          UNION ALL SELECT unique_key FROM ${s}.parked WHERE job_id = ${id}
          UNION ALL SELECT unique_key FROM ${s}.terminal WHERE job_id = ${id} AND wide
          UNION ALL SELECT unique_key FROM ${s}.history WHERE job_id = ${id}
          UNION ALL SELECT unique_key FROM ${s}.dlq WHERE job_id = ${id}
        ) k WHERE k.unique_key IS NOT NULL LIMIT 1`
      const attempts = yield* sql<{
        attempt: number
        run_lease: bigint
        claimed_at: Date
        closed_at: Date | null
        outcome: string | null
      }>`
        SELECT DISTINCT ON (c.run_lease) c.attempt, c.run_lease, c.claimed_at, z.closed_at, z.outcome
        FROM ${s}.claims c
        LEFT JOIN ${s}.closures z ON z.job_id = c.job_id AND z.run_lease = c.run_lease
        WHERE c.job_id = ${id}
        ORDER BY c.run_lease, z.closed_at NULLS LAST`
      return {
        uniqueKey: key?.key ?? null,
        attempts: attempts.map(
          (a): AttemptView => ({
            attempt: a.attempt,
            runLease: a.run_lease,
            claimedAt: a.claimed_at,
            endedAt: a.closed_at,
            outcome: a.outcome,
            durationMs: a.closed_at === null ? null : a.closed_at.getTime() - a.claimed_at.getTime()
          })
        )
      } satisfies JobDetail
    })

  const listJobs = (filter: ListFilter) =>
    Effect.gen(function* () {
      yield* checkListLimit(filter)
      const conditions = [
        filter.queue === undefined ? undefined : sql`queue = ${filter.queue}`,
        filter.kind === undefined ? undefined : sql`kind = ${filter.kind}`,
        filter.state === undefined ? undefined : sql`state = ${filter.state}`,
        filter.tag === undefined ? undefined : sql`${filter.tag} = ANY (tags)`,
        filter.before === undefined ? undefined : sql`job_id < ${filter.before}`,
        filter.createdAfter === undefined ? undefined : sql`created_at >= ${filter.createdAfter}`,
        filter.createdBefore === undefined ? undefined : sql`created_at < ${filter.createdBefore}`,
        filter.finalizedAfter === undefined ? undefined : sql`finalized_at >= ${filter.finalizedAfter}`,
        filter.finalizedBefore === undefined ? undefined : sql`finalized_at < ${filter.finalizedBefore}`
      ].filter((c) => c !== undefined)
      const rows = yield* sql<JobRow>`
        SELECT * FROM ${s}.jobs ${conditions.length > 0 ? sql`WHERE ${sql.and(conditions)}` : sql``}
        ORDER BY job_id DESC LIMIT ${filter.limit ?? 100}`
      return rows.map(toView)
    })

  const countByQueueState = Effect.map(
    sql<{ queue: string; state: JobState; count: bigint }>`
      SELECT queue, state, count(*) AS count FROM ${s}.jobs GROUP BY queue, state ORDER BY queue, state`,
    (rows) => rows.map((r): QueueStateCount => ({ queue: r.queue, state: r.state, count: Number(r.count) }))
  )

  // queue_stats (migration 0030): one statement, one snapshot. The exact variant adds the stored
  // terminal counts from the jobs view (a scan of every stored job) in a second statement: at
  // READ COMMITTED its snapshot is a few ms later (a job finalized in between shows in `stored`
  // and not yet in `finalizedTotal`).
  const queueStats = (options: QueueStatsOptions = {}) =>
    Effect.gen(function* () {
      yield* checkStatsWindow(options.windowMs)
      const windowMs = options.windowMs ?? statsWindowMsRange.default
      const exact = options.exact === true
      const rows = yield* sql<QueueStatsRow>`SELECT * FROM ${s}.queue_stats(${windowMs})`
      const stored = exact
        ? yield* sql<{ queue: string; state: string; count: bigint }>`
              SELECT queue, state, count(*) AS count FROM ${s}.jobs
              WHERE state IN ('completed', 'failed', 'cancelled') AND dlq_reason IS NULL
              GROUP BY queue, state`
        : []
      const now =
        rows.length === 0 ? (yield* sql<{ now: Date }>`SELECT now() AS now`)[0]!.now : rows[0]!.as_of
      // the rates over the same window, from the leader's samples (migration 0031)
      const rates = yield* sql<QueueRatesRow>`SELECT * FROM ${s}.queue_rates(${windowMs})`
      return toQueueStatsReport(rows, stored, exact, now, windowMs, rates)
    })

  // queue_history (migration 0031): the samples of the window, summed per queue and bucket.
  const queueHistory = (options: QueueHistoryOptions = {}) =>
    Effect.gen(function* () {
      yield* checkHistoryOptions(options.windowMs, options.bucketMs)
      const windowMs = options.windowMs ?? historyWindowMsRange.default
      const bucketMs = options.bucketMs ?? historyBucketMsRange.default
      const rows = yield* sql<{
        queue: string
        bucket_start: Date
        enqueued: bigint
        completed: bigint
        failed: bigint
        cancelled: bigint
      }>`SELECT * FROM ${s}.queue_history(${windowMs}, ${bucketMs})`
      const [now] = yield* sql<{ now: Date }>`SELECT now() AS now`
      const queues = new Map<string, Array<HistoryBucket>>()
      for (const r of rows) {
        const buckets = queues.get(r.queue) ?? []
        buckets.push({
          start: r.bucket_start,
          enqueued: Number(r.enqueued),
          completed: Number(r.completed),
          failed: Number(r.failed),
          cancelled: Number(r.cancelled)
        })
        queues.set(r.queue, buckets)
      }
      return {
        asOf: now!.now,
        windowMs,
        bucketMs,
        queues: [...queues].map(([queue, buckets]) => ({ queue, buckets }))
      } satisfies QueueHistoryReport
    })

  const sampleQueueStats = (params: SampleParams) =>
    Effect.map(
      rc(
        "sampleQueueStats",
        sql<{ at: Date | null }>`
          SELECT ${s}.sample_queue_stats(${params.minIntervalMs}::bigint, ${params.keepMs}::bigint) AS at`
      ),
      (rows) => rows[0]?.at ?? null
    )

  const recordPruneState = (ring: "queue" | "history", state: PruneState) =>
    Effect.map(
      rc(
        "recordPruneState",
        sql<{ changed: boolean }>`
          SELECT ${s}.record_prune_state(${ring}, ${state.outcome}, ${state.reason}) AS changed`
      ),
      (rows) => rows[0]?.changed === true
    )

  const cancelJob = (id: bigint, reason: string) =>
    Effect.gen(function* () {
      const [row] = yield* rc(
        "cancelJob",
        sql<{
          result: string | null
        }>`SELECT ${s}.cancel_job(${id}, ${reason.slice(0, maxErrorMessageLength)}) AS result`
      )
      if (row?.result == null) return yield* new JobNotFound({ jobId: id })
      if (row.result.startsWith("terminal:")) {
        return yield* new InvalidTransition({
          jobId: id,
          from: row.result.slice("terminal:".length),
          action: "cancel"
        })
      }
      return yield* getJob(id)
    })

  const cancelByUniqueKey = (key: string, reason: string) =>
    Effect.map(
      rc(
        "cancelByUniqueKey",
        sql<{ id: bigint | null }>`
          SELECT ${s}.cancel_by_unique_key(${key}, ${reason.slice(0, maxErrorMessageLength)}) AS id`
      ),
      (rows) => Option.fromNullishOr(rows[0]?.id)
    )

  const retryJob = (id: bigint) =>
    Effect.gen(function* () {
      const [row] = yield* rc(
        "retryJob",
        sql<{ result: string | null }>`SELECT ${s}.retry_job_or_dlq(${id}) AS result`
      )
      if (row?.result == null) return yield* new JobNotFound({ jobId: id })
      if (row.result !== "available")
        return yield* new InvalidTransition({ jobId: id, from: row.result, action: "retry" })
      return yield* getJob(id)
    }).pipe(mapUniqueConflict)

  const setPaused = (queue: string, paused: boolean) =>
    Effect.gen(function* () {
      yield* checkQueueName(queue)
      yield* sql`
        INSERT INTO ${s}.queue_meta (queue, paused) VALUES (${queue}, ${paused})
        ON CONFLICT (queue) DO UPDATE SET paused = excluded.paused, updated_at = now()`
      // a resumed queue's jobs sent their wake-ups while it was paused: wake its workers now, since
      // idle dispatchers that listen poll rarely (delivered on commit)
      if (!paused) yield* sql`SELECT pg_notify(${wakeChannel(schema)}, ${queue})`
    })

  const status = Effect.map(
    sql<{ generation: bigint; slot: number; oldest: bigint | null; history_generation: bigint }>`
      SELECT q.generation, q.slot, h.generation AS history_generation,
             -- inside the newest wrap, as prune_queue looks: every older incarnation is pruned
             -- (rotation enters generation k only once k − N is), so this costs at most N probes
             -- however long the ledger is
             (SELECT min(g.g) FROM generate_series(greatest(0, q.generation - ${s}.ring_slots('queue') + 1),
                                                    q.generation - 1) AS g(g)
              WHERE NOT EXISTS (SELECT 1 FROM ${s}.ring_prunes p WHERE p.ring = 'queue' AND p.generation = g.g)) AS oldest
      FROM ${s}.ring_current('queue') q, ${s}.ring_current('history') h`,
    (rows) => {
      const r = rows[0]!
      return {
        generation: r.generation,
        slot: r.slot,
        oldestUnpruned: r.oldest,
        historyGeneration: r.history_generation
      }
    }
  )

  const configureQueue = (queue: string, settings: QueueSettings) =>
    Effect.gen(function* () {
      yield* checkQueueName(queue)
      const retention = settings.dlqRetentionMs
      if (retention !== undefined && retention !== null)
        yield* checkInteger("dlqRetentionMs", retention, 1, maxDlqRetentionMs)
      const shards = settings.enqueueShards
      if (shards !== undefined) yield* checkInteger("enqueueShards", shards, 1, maxEnqueueShards)
      const interval = (ms: number | null) => (ms === null ? null : `${ms} milliseconds`)
      // Only the fields given change: the others keep their stored value.
      yield* sql`
        INSERT INTO ${s}.queue_meta (queue, dlq_enabled, dlq_retention, enqueue_shards)
        VALUES (${queue}, ${settings.dlq ?? null}, ${interval(retention ?? null)}::interval, ${shards ?? 1})
        ON CONFLICT (queue) DO UPDATE SET
          dlq_enabled = CASE WHEN ${settings.dlq !== undefined} THEN excluded.dlq_enabled ELSE queue_meta.dlq_enabled END,
          dlq_retention = CASE WHEN ${retention !== undefined} THEN excluded.dlq_retention ELSE queue_meta.dlq_retention END,
          enqueue_shards = CASE WHEN ${shards !== undefined} THEN excluded.enqueue_shards ELSE queue_meta.enqueue_shards END,
          updated_at = now()`
    })

  const setDlqDefault = (enabled: boolean) =>
    Effect.asVoid(sql`
      INSERT INTO ${s}.settings (key, value) VALUES ('dlq_enabled_by_default', ${JSON.stringify(enabled)}::jsonb)
      ON CONFLICT (key) DO UPDATE SET value = excluded.value, updated_at = now()`)

  // 0051: a constant function enqueue_one and enqueue_batch fold into their plans; setting it
  // replaces the function (set_wake_on_demand), which invalidates those plans everywhere.
  const wakeOnDemand = Effect.map(
    sql<{ on: boolean }>`SELECT ${s}.wake_on_demand() AS on`,
    (rows) => rows[0]?.on === true
  )
  const setWakeOnDemand = (enabled: boolean) => Effect.asVoid(sql`SELECT ${s}.set_wake_on_demand(${enabled})`)

  const dlqFilterArgs = (f: DlqFilter) =>
    sql`${f.queue ?? null}::text, ${f.kind ?? null}::text, ${f.tag ?? null}::text, ${f.since ?? null}::timestamptz,
        ${f.until ?? null}::timestamptz, ${f.before ?? null}::bigint`

  const listDlq = (filter: DlqFilter) =>
    Effect.gen(function* () {
      yield* checkDlqLimit(filter)
      const rows = yield* sql<DlqRow>`
        SELECT * FROM ${s}.dlq_matching(${dlqFilterArgs(filter)}) ORDER BY job_id DESC LIMIT ${filter.limit ?? 50}`
      return rows.map(toDlqEntry)
    })

  const getDlq = (id: bigint) =>
    Effect.gen(function* () {
      const rows = yield* sql<DlqRow>`SELECT * FROM ${s}.dlq WHERE job_id = ${id}`
      if (rows.length === 0) return yield* new JobNotFound({ jobId: id })
      return toDlqEntry(rows[0]!)
    })

  const retryFromDlq = (id: bigint, overrides: DlqRetryOverrides = {}) =>
    Effect.gen(function* () {
      if (overrides.queue !== undefined) yield* checkQueueName(overrides.queue)
      if (overrides.priority !== undefined) yield* checkInteger("priority", overrides.priority, 1, 4)
      if (
        overrides.runAt !== undefined &&
        !(overrides.runAt instanceof Date && !Number.isNaN(overrides.runAt.getTime()))
      ) {
        return yield* new ValidationError({ field: "runAt", reason: "must be a valid Date" })
      }
      const [row] = yield* rc(
        "retryFromDlq",
        sql<{ result: string | null }>`
          SELECT ${s}.retry_from_dlq(${id}, ${overrides.queue ?? null}::text, ${overrides.priority ?? null}::int,
                                     ${overrides.runAt ?? null}::timestamptz) AS result`
      )
      if (row?.result == null) return yield* new JobNotFound({ jobId: id })
      return yield* getJob(id)
    }).pipe(mapUniqueConflict)

  const purgeDlq = (id: bigint) =>
    Effect.gen(function* () {
      // a purged job is gone for good: a key it still held (mask with 'failed') is released
      const rows = yield* sql`
        WITH gone AS (DELETE FROM ${s}.dlq WHERE job_id = ${id} RETURNING job_id, unique_key),
        released AS (DELETE FROM ${s}.unique_claims u USING gone g WHERE u.unique_key = g.unique_key AND u.job_id = g.job_id)
        SELECT job_id FROM gone`
      if (rows.length === 0) return yield* new JobNotFound({ jobId: id })
    })

  // Bulk DLQ actions in batches of `bulkBatch` entries, each its own transaction (unless the
  // caller's transaction holds them all): no lock is held across batches (migration 0027). The
  // cursor (last id looked at) passes entries a batch left in the DLQ (a unique conflict).
  const dlqBulk = (
    action: "retry" | "purge",
    filter: DlqFilter,
    options: { readonly all?: boolean | undefined } & BulkProgress = {}
  ) =>
    Effect.gen(function* () {
      yield* checkBulkFilter(action === "retry" ? "retryDlqBulk" : "purgeDlqBulk", filter, options)
      const operation = action === "retry" ? "retryDlqBulk" : "purgeDlqBulk"
      let after = 0n
      let total = 0
      for (;;) {
        const [row] = yield* rc(
          operation,
          action === "retry"
            ? sql<{ n: number; last: bigint | null }>`
                SELECT retried AS n, last_job_id AS last
                FROM ${s}.dlq_retry_batch(${dlqFilterArgs(filter)}, ${after}::bigint, ${bulkBatch})`
            : sql<{ n: number; last: bigint | null }>`
                SELECT purged AS n, last_job_id AS last
                FROM ${s}.dlq_purge_batch(${dlqFilterArgs(filter)}, ${after}::bigint, ${bulkBatch})`
        )
        if (row?.last == null) return total
        total += row.n
        after = row.last
        if (options.onBatch !== undefined) yield* options.onBatch(total)
      }
    })

  const cleanupDlq = (defaultRetentionMs: number, batch: number) =>
    Effect.map(
      rc(
        "cleanupDlq",
        sql<{ n: number }>`SELECT ${s}.cleanup_dlq(${defaultRetentionMs}::bigint, ${batch}) AS n`
      ),
      (rows) => rows[0]?.n ?? 0
    )

  // In batches of `bulkBatch` jobs, each its own transaction (unless the caller's transaction holds
  // them all): no per-job lock, and the queue's lanes are locked one batch at a time (0027). Only
  // jobs that exist when the drain starts: a producer cannot keep it going.
  const drainQueue = (queue: string, reason: string, progress: BulkProgress = {}) =>
    Effect.gen(function* () {
      yield* checkQueueName(queue)
      const [ceiling] = yield* sql<{ id: bigint }>`SELECT last_value AS id FROM ${s}.job_id_seq`
      let total = 0
      for (;;) {
        const [row] = yield* rc(
          "drainQueue",
          sql<{ n: number }>`
            SELECT ${s}.drain_queue_batch(${queue}, ${reason.slice(0, maxErrorMessageLength)}, ${bulkBatch},
                                          ${ceiling!.id}::bigint) AS n`
        )
        if (!row || row.n === 0) return total
        total += row.n
        if (progress.onBatch !== undefined) yield* progress.onBatch(total)
      }
    })

  return QueueStorage.of({
    enqueueMany,
    claim,
    finalizeMany,
    heartbeatMany,
    promoteDue,
    rescueStale: (p) => rescue("stale", p.stalenessMs, p.limit),
    rescueDeadlines: (limit) => rescue("deadline", 0, limit),
    rotate: rotateQueue(rotateMinRows, rotateMaxAgeMs),
    rotateWhenDue,
    prune: (r) =>
      r.carryAfterMs === undefined
        ? pruneRing("prune_queue", r)
        : Effect.andThen(
            checkInteger(
              "carryAfterMs",
              r.carryAfterMs,
              pruneCarryAfterMsRange.min,
              pruneCarryAfterMsRange.max
            ),
            pruneRing("prune_queue", r)
          ),
    rotateHistory: (intervalMs) => rotateRing("history", intervalMs),
    pruneHistory: (r) => pruneRing("prune_history", r),
    trimLedgers,
    getJob,
    jobDetail,
    listJobs,
    countByQueueState,
    queueStats,
    queueHistory,
    sampleQueueStats,
    recordPruneState,
    cancelJob,
    cancelByUniqueKey,
    retryJob,
    pauseQueue: (queue) => setPaused(queue, true),
    resumeQueue: (queue) => setPaused(queue, false),
    configureQueue,
    setDlqDefault,
    wakeOnDemand,
    setWakeOnDemand,
    listDlq,
    getDlq,
    retryFromDlq,
    purgeDlq,
    retryDlqBulk: (filter, options) => dlqBulk("retry", filter, options),
    purgeDlqBulk: (filter, options) => dlqBulk("purge", filter, options),
    cleanupDlq,
    drainQueue,
    status
  })
})

interface QueueRatesRow {
  readonly queue: string
  readonly enqueued: bigint
  readonly completed: bigint
  readonly failed: bigint
  readonly cancelled: bigint
  readonly span_start: Date | null
  readonly span_end: Date | null
  readonly enqueue_span_start: Date | null
  readonly enqueue_span_end: Date | null
}

interface QueueStatsRow {
  readonly queue: string
  readonly paused: boolean
  readonly available: bigint
  readonly running: bigint
  readonly scheduled: bigint
  readonly retryable: bigint
  readonly dead_lettered: bigint
  readonly oldest_available_at: Date | null
  readonly completed_total: bigint
  readonly failed_total: bigint
  readonly cancelled_total: bigint
  readonly recent_completed: bigint
  readonly recent_failed: bigint
  readonly recent_cancelled: bigint
  readonly window_start: Date
  readonly as_of: Date
}

/** queue_stats rows (and, exact, stored terminal counts) as the report. */
const toQueueStatsReport = (
  rows: ReadonlyArray<QueueStatsRow>,
  stored: ReadonlyArray<{ readonly queue: string; readonly state: string; readonly count: bigint }>,
  exact: boolean,
  now: Date,
  windowMs: number,
  rateRows: ReadonlyArray<QueueRatesRow>
): QueueStatsReport => {
  const r0 = rateRows[0]
  const span: RatesSpan | null =
    r0 === undefined || r0.span_start === null || r0.span_end === null
      ? null
      : {
          start: r0.span_start,
          end: r0.span_end,
          enqueueStart: r0.enqueue_span_start,
          enqueueEnd: r0.enqueue_span_end
        }
  const ratesOf = (queue: string): QueueRates | null => {
    if (span === null) return null
    const r = rateRows.find((x) => x.queue === queue)
    return toRates(
      {
        enqueued: Number(r?.enqueued ?? 0n),
        completed: Number(r?.completed ?? 0n),
        failed: Number(r?.failed ?? 0n),
        cancelled: Number(r?.cancelled ?? 0n)
      },
      span
    )
  }
  const storedOf = (queue: string): FinalizedCounts => {
    const of = (state: string) =>
      Number(stored.find((x) => x.queue === queue && x.state === state)?.count ?? 0n)
    return { completed: of("completed"), failed: of("failed"), cancelled: of("cancelled") }
  }
  const first = rows[0]
  return {
    asOf: first?.as_of ?? now,
    exact,
    windowStart: first?.window_start ?? new Date(now.getTime() - windowMs),
    staleness: `${statsStaleness}; ${ratesStaleness}`,
    rates: span,
    queues: rows.map((r) => ({
      queue: r.queue,
      paused: r.paused,
      available: Number(r.available),
      running: Number(r.running),
      scheduled: Number(r.scheduled),
      retryable: Number(r.retryable),
      deadLettered: Number(r.dead_lettered),
      oldestAvailableAt: r.oldest_available_at,
      finalizedTotal: {
        completed: Number(r.completed_total),
        failed: Number(r.failed_total),
        cancelled: Number(r.cancelled_total)
      },
      recent: {
        completed: Number(r.recent_completed),
        failed: Number(r.recent_failed),
        cancelled: Number(r.recent_cancelled)
      },
      stored: exact ? storedOf(r.queue) : null,
      rates: ratesOf(r.queue)
    }))
  }
}

/** The Postgres storage layer; needs the application's `SqlClient` (`@effect/sql-pg`). */
export const layer = (options: PgQueueStorageOptions = {}) => Layer.effect(QueueStorage, make(options))
