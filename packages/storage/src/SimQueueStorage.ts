/**
 * `SimQueueStorage`: an in-memory, deterministic implementation of `QueueStorage` (capability 30).
 * Swap it in for `PgQueueStorage` in tests and drive time with `TestClock`: nothing here reads the
 * wall clock or `Math.random` directly.
 *
 * **Guarantees**
 * - Same observable semantics as the Postgres layer for every operation of `QueueStorage`: strict
 *   FIFO per lane `(queue, priority, shard 0)`; lanes served by effective priority (claim-time aging),
 *   then head `runAt`, then stored priority; `runLease` guards every attempt-scoped write (a write for
 *   an attempt that is no longer open is `Stale` and changes nothing); unique keys held per state mask.
 * - Each operation is atomic: validation runs first, then the whole read-modify-write runs
 *   synchronously in one step no other fiber can interleave with. A call that fails (validation,
 *   unique conflict) changes nothing.
 * - Time comes only from `Clock.currentTimeMillis` (so `TestClock` drives due times, deadlines,
 *   heartbeat staleness, aging and retention); rescue backoff jitter comes only from Effect's
 *   `Random` service, read at call time.
 * - State lives in the layer instance: every `make`/`layer` build starts empty.
 * - A transition that re-enters a job's unique mask while a newer job holds its key (retry, snooze,
 *   rescue, promotion or claim of a job whose mask omits the state it leaves) cancels the
 *   re-entering job with `cancelled: superseded by duplicate <id>` (capabilities.md §4); operator
 *   `retryJob` fails with `UniqueConflict` instead and changes nothing.
 * - Dead letter queue (capability 19): a job that ends `failed` (reasons `terminal_error`,
 *   `max_attempts_exhausted`, `stale_heartbeat`, `deadline_exceeded`) is dead-lettered when its
 *   queue's `dlq` setting is true, or unset and the global default (`setDlqDefault`, initially
 *   false) is true. It stays `failed` with `dlqReason` set (so `listJobs` and `countByQueueState`
 *   show it as failed), and the entry keeps the attempt's run lease as `originalRunLease`.
 *   `pruneHistory` never deletes it; `purgeDlq`, `purgeDlqBulk` and `cleanupDlq` delete the job
 *   entirely (releasing any key it holds). `retryFromDlq`, `retryDlqBulk` (oldest id first, skipping
 *   unique conflicts) and operator `retryJob` take it back to work: fresh lane position, attempt 0,
 *   run lease unchanged. Per-queue `dlqRetentionMs` is 1 ms – 3,650 days.
 *
 * **Gotchas** (differences from Postgres)
 * - No transactions: `enqueueMany` does not join the caller's `@effect/sql` transaction, and a
 *   rollback of that transaction does not undo it. Each call is atomic on its own.
 * - Jitter is deterministic only under a seeded `Random` (`Random.withSeed`); Effect's default
 *   `Random` (also under `it.effect`) wraps `Math.random`.
 * - Times are whole milliseconds of the Effect `Clock` (Postgres: the database's `now()`, in
 *   microseconds). Under `TestClock` time stands still until adjusted, so jobs enqueued together share
 *   one `runAt`/`createdAt`, and a zero delay is due immediately.
 * - No rings: `rotate`, `rotateWhenDue` and `rotateHistory` return `"SkippedIdle"`, `prune` is a
 *   `Noop` and `trimLedgers` deletes nothing (after the same argument checks), `status` is all
 *   zeros. Terminal jobs stay visible until `pruneHistory`, which deletes each one as soon as it
 *   is older than its retention (Postgres reclaims whole history partitions, so jobs may outlive
 *   their retention there) and reports a plain counter as `generation`.
 * - Ids are gap-free: a rejected `enqueueMany` consumes none (a Postgres sequence can leave gaps).
 * - No locks or contention: concurrent claimers are served one after the other, never skipping a
 *   lane another claimer holds; there is no LISTEN/NOTIFY. One shard per lane (shard 0).
 * - Args and metadata are stored as their canonical JSON and parsed on every read, so callers never
 *   share objects with the store; object key order is canonical, not jsonb's. Heartbeat progress is
 *   stored as `JSON.stringify` text: a value that is not JSON is a defect, and NUL characters, which
 *   jsonb rejects, are accepted.
 * - `countByQueueState` orders queue names by UTF-8 bytes (Postgres's `C` collation); a database
 *   with a linguistic collation may order them differently.
 * - Pause state, queue settings, the DLQ default and everything else are lost when the layer's
 *   scope closes.
 * - A `retryFromDlq` override `runAt` that is not a valid `Date` is a `ValidationError` (field
 *   `runAt`); Postgres passes it to the database as is.
 * - `waiting_on` is never produced (no dependencies). `waiting_external` comes from the
 *   `CallbackStorage` the layer also provides (SimCallbackStorage.ts).
 */
import {
  Backoff,
  CanonicalJson,
  type CheckedJob,
  checkNewJob,
  checkQueueName,
  concurrencyKeyMetadata,
  InvalidTransition,
  isTerminal,
  JobNotFound,
  type JobState,
  limits,
  maskHas,
  type NewJob,
  UniqueConflict,
  UniqueKey,
  ValidationError
} from "@awa/core"
import { Clock, Context, Effect, Layer, Option, Random } from "effect"
import type { Mutable } from "effect/Types"
import { CallbackStorage } from "./CallbackStorage.ts"
import {
  type AttemptToken,
  type AttemptView,
  type BulkProgress,
  type ClaimedJob,
  type ClaimParams,
  type DlqEntry,
  type DlqFilter,
  type DlqReason,
  type DlqRetryOverrides,
  type EnqueuedJob,
  type ErrorEntry,
  type FinalizedCounts,
  type FinalizeItem,
  type FinalizeResult,
  type HeartbeatItem,
  type HistoryBucket,
  type JobDetail,
  type JobId,
  type JobView,
  type ListFilter,
  type Outcome,
  type PruneOutcome,
  type PruneParams,
  type PruneState,
  type QueueHistoryOptions,
  type QueueHistoryReport,
  type QueueSettings,
  type QueueStateCount,
  type QueueStats,
  type QueueStatsOptions,
  type QueueStatsReport,
  QueueStorage,
  type RatesSpan,
  type RescuedAttempt,
  type RescueParams,
  type RetentionParams,
  type RotatePolicy,
  type SampleParams,
  type StorageStatus
} from "./QueueStorage.ts"
import type { SimCallback } from "./SimCallbackStorage.ts"
import * as SimCallbackStorage from "./SimCallbackStorage.ts"
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
  defaultListLimit,
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

/** Newest error entries kept per job. */
const maxErrorEntries = 100

/** Why and when a failed job was dead-lettered. */
interface DlqMark {
  readonly reason: DlqReason
  readonly at: number
  /** The run lease of the attempt that failed. */
  readonly originalRunLease: bigint
}

/** Per-queue settings; `null` falls back to the global default (routing) or the cleanup default (retention). */
interface SimQueueSettings {
  dlq: boolean | null
  dlqRetentionMs: number | null
}

/** One job, mutable in place; only this module sees it. */
interface SimJob {
  readonly id: JobId
  readonly kind: string
  /** Queue and priority change only when a DLQ retry overrides them. */
  queue: string
  priority: number
  readonly maxAttempts: number
  readonly argsJson: string
  readonly metadataJson: string
  readonly tags: ReadonlyArray<string>
  readonly createdAt: number
  /** Hex of the unique key, if the job is unique. */
  readonly uniqueKey: string | undefined
  readonly uniqueStates: number
  state: JobState
  attempt: number
  runLease: bigint
  runAt: number
  errors: Array<ErrorEntry>
  progressJson: string | null
  claimedAt: number | null
  deadlineAt: number | null
  heartbeatAt: number | null
  finalizedAt: number | null
  /** Set while the job sits in the dead letter queue (its state is then `failed`). */
  dlq: DlqMark | null
  /**
   * The key grant of a keyed claim (capabilities.md §23): open while `runLease` is still this
   * lease and the job is running or parked; any closure moves the job on and so closes it.
   */
  grant?: { readonly policy: string; readonly key: string; readonly lease: bigint; readonly at: number }
  /** The open attempt's callback (SimCallbackStorage), cleared when the attempt closes. */
  callback: SimCallback | null
}

/** What `SimKeyGrants` needs of the store behind one `SimQueueStorage` (registered per service). */
export interface SimKeyHooks {
  /**
   * Claims from `params.queue` lane by lane in claim order, taking each lane's jobs from its head
   * while `admit(key)` allows them (`undefined` = unkeyed). A job whose unique key is taken at
   * claim ends its lane's walk, as on Postgres.
   */
  readonly claimPrefix: (
    params: ClaimParams,
    policy: string,
    admit: (key: string | undefined) => boolean,
    now: number
  ) => ReadonlyArray<ClaimedJob>
  /** The open grants, each with its policy, key and claim time. */
  readonly grants: () => ReadonlyArray<{ readonly policy: string; readonly key: string; readonly at: number }>
}

const simHooks = new WeakMap<object, SimKeyHooks>()

/** The hooks of a `SimQueueStorage` service (undefined for any other layer's service). */
export const keyHooksOf = (service: object): SimKeyHooks | undefined => simHooks.get(service)

const concurrencyKeyOf = (job: SimJob): string | undefined => {
  if (!job.metadataJson.includes(concurrencyKeyMetadata)) return undefined
  const value = (JSON.parse(job.metadataJson) as Record<string, unknown>)[concurrencyKeyMetadata]
  return typeof value === "string" ? value : undefined
}

/** Window of one keyed claim, as claim_keyed's (migration 0033). */
const keyedWindow = 64

const iso = (millis: number): string => new Date(millis).toISOString()

/** Parked with its callback pending: reads `waiting_external`; no worker heartbeats it (0034). */
const parkedPending = (job: SimJob): boolean =>
  job.state === "running" && job.callback !== null && job.callback.waiting && job.callback.state === "pending"

const retentionOf = (retention: RetentionParams, state: JobState): number | undefined => {
  switch (state) {
    case "completed":
      return retention.completedMs
    case "failed":
      return retention.failedMs
    case "cancelled":
      return retention.cancelledMs
    default:
      return undefined
  }
}

const rescuedError = {
  stale_heartbeat: "heartbeat stale: worker presumed dead",
  deadline_exceeded: "hard deadline exceeded",
  callback_timeout: "callback timed out"
} as const

/**
 * One lane's available jobs in position order. Claims take the head, so leaving from the head is
 * O(1) (a moving start index, compacted now and then); leaving from elsewhere (cancel) splices.
 * A plain array with `splice(0, 1)` made a drain quadratic in the backlog.
 */
class Lane {
  private items: Array<SimJob> = []
  private start = 0
  get size() {
    return this.items.length - this.start
  }
  head(): SimJob | undefined {
    return this.items[this.start]
  }
  push(job: SimJob) {
    this.items.push(job)
  }
  remove(job: SimJob) {
    if (this.items[this.start] === job) {
      this.start++
      if (this.start > 1024 && this.start * 2 > this.items.length) {
        this.items = this.items.slice(this.start)
        this.start = 0
      }
      return
    }
    const index = this.items.indexOf(job, this.start)
    if (index >= 0) this.items.splice(index, 1)
  }
}

/**
 * Both simulated services over one store: `QueueStorage` and the `CallbackStorage` of its attempts.
 */
export const makeWithCallbacks: Effect.Effect<{
  readonly storage: QueueStorage["Service"]
  readonly callbacks: CallbackStorage["Service"]
}> = Effect.gen(function* () {
  /** Every stored job by id; insertion order is id order (ids only grow, jobs are never re-inserted). */
  const jobs = new Map<JobId, SimJob>()
  /** Available jobs per queue, then per priority (one lane each, shard 0), in position order. */
  const lanes = new Map<string, Map<number, Lane>>()
  /** Unique key (hex) → the job holding it. */
  const keys = new Map<string, SimJob>()
  const paused = new Set<string>()
  /** Dead-lettered jobs by id (each is also in `jobs`, state `failed`, with `dlq` set). */
  const deadLetters = new Map<JobId, SimJob>()
  const queueSettings = new Map<string, SimQueueSettings>()
  /** Every finalization outside the DLQ, oldest first, for `queueStats` (totals and `recent`). */
  const finalizations: Array<{
    readonly queue: string
    readonly state: keyof FinalizedCounts
    readonly at: number
  }> = []
  /** The leader's samples (mirrors stat_samples/queue_samples, migration 0031), oldest first. */
  const samples: Array<{
    readonly at: number
    readonly hw: bigint
    readonly countedThrough: bigint
    readonly enqueuedFrom: number | null
    readonly enqueuedUntil: number | null
    readonly queues: ReadonlyMap<string, FinalizedCounts & { enqueued: number; totals: FinalizedCounts }>
  }> = []
  /** Every attempt of each job, in claim order (mirrors claims and closures). */
  const attempts = new Map<JobId, Array<AttemptView>>()
  /** Each ring's prune state as the leader recorded it (mirrors maintenance_state). */
  const pruneStates = new Map<string, PruneState & { since: number }>()
  let dlqDefault = false
  let nextId = 1n
  let historyGeneration = 0n

  // ---------------------------------------------------------------------------------------------
  // State bookkeeping (synchronous; callers run it inside one Effect.sync/suspend step)

  const laneOf = (job: SimJob): Lane => {
    let queueLanes = lanes.get(job.queue)
    if (queueLanes === undefined) {
      queueLanes = new Map()
      lanes.set(job.queue, queueLanes)
    }
    let lane = queueLanes.get(job.priority)
    if (lane === undefined) {
      lane = new Lane()
      queueLanes.set(job.priority, lane)
    }
    return lane
  }

  /**
   * Positions come from one global increasing counter, so appending keeps a lane in position order:
   * entering a lane is taking the next position.
   */
  const enterLane = (job: SimJob) => {
    laneOf(job).push(job)
  }

  const leaveLane = (job: SimJob) => laneOf(job).remove(job)

  /** Makes the unique key follow the job's state: held while the state is in the mask. */
  const syncKey = (job: SimJob) => {
    const key = job.uniqueKey
    if (key === undefined) return
    if (maskHas(job.uniqueStates, job.state)) {
      if (!keys.has(key)) keys.set(key, job)
    } else if (keys.get(key) === job) {
      keys.delete(key)
    }
  }

  /** Another job holding the key `job` would need in state `to`, if any. */
  const blocker = (job: SimJob, to: JobState): SimJob | undefined => {
    if (job.uniqueKey === undefined || !maskHas(job.uniqueStates, to)) return undefined
    const holder = keys.get(job.uniqueKey)
    return holder !== undefined && holder !== job ? holder : undefined
  }

  /** Moves a job to `to`; lane membership and its unique key follow. Callers check `blocker` first. */
  const transition = (job: SimJob, to: JobState) => {
    if (job.state === "available") leaveLane(job)
    job.state = to
    if (to === "available") enterLane(job)
    syncKey(job)
  }

  const appendError = (job: SimJob, entry: ErrorEntry) => {
    job.errors.push(entry)
    if (job.errors.length > maxErrorEntries) job.errors.splice(0, job.errors.length - maxErrorEntries)
  }

  const closeAttempt = (job: SimJob, now: number, to: JobState) => {
    const open = attempts.get(job.id)?.at(-1)
    if (open !== undefined && open.endedAt === null)
      attempts.get(job.id)![attempts.get(job.id)!.length - 1] = {
        ...open,
        endedAt: new Date(now),
        outcome: to,
        durationMs: now - open.claimedAt.getTime()
      }
    job.claimedAt = null
    job.deadlineAt = null
    job.heartbeatAt = null
    job.callback = null
  }

  const finish = (
    job: SimJob,
    to: "completed" | "failed" | "cancelled",
    now: number,
    toDlq = false
  ): JobState => {
    if (job.state === "running") closeAttempt(job, now, to)
    job.finalizedAt = now
    transition(job, to)
    // as Postgres's ledgers: a dead-lettered job is counted by the DLQ, not as a finalization
    if (!toDlq) finalizations.push({ queue: job.queue, state: to, at: now })
    return to
  }

  /** Whether failed jobs of `queue` go to the dead letter queue. */
  const routesToDlq = (queue: string): boolean => queueSettings.get(queue)?.dlq ?? dlqDefault

  /** Ends a job `failed`, dead-lettering it with `reason` when its queue routes there. */
  const fail = (job: SimJob, reason: DlqReason, now: number): JobState => {
    const originalRunLease = job.runLease
    const toDlq = routesToDlq(job.queue)
    finish(job, "failed", now, toDlq)
    if (toDlq) {
      job.dlq = { reason, at: now, originalRunLease }
      deadLetters.set(job.id, job)
    }
    return "failed"
  }

  /** Takes a job out of the dead letter queue (it stays whatever state it is in). */
  const undead = (job: SimJob) => {
    job.dlq = null
    deadLetters.delete(job.id)
  }

  /** Deletes a job entirely: it leaves the store, any lane, the DLQ, and releases its key. */
  const remove = (job: SimJob) => {
    if (job.state === "available") leaveLane(job)
    undead(job)
    jobs.delete(job.id)
    if (job.uniqueKey !== undefined && keys.get(job.uniqueKey) === job) keys.delete(job.uniqueKey)
  }

  const cancel = (job: SimJob, reason: string, now: number): JobState => {
    appendError(job, {
      error: `cancelled: ${reason.slice(0, maxErrorMessageLength)}`,
      attempt: job.attempt,
      at: iso(now)
    })
    return finish(job, "cancelled", now)
  }

  /** A job re-entering its mask while a newer job holds the key gives way (capabilities.md §4). */
  const supersede = (job: SimJob, holder: SimJob, now: number): JobState =>
    cancel(job, `superseded by duplicate ${holder.id}`, now)

  /** Sends a job to `scheduled`/`retryable` at `runAt`, unless that would take a held key. */
  const defer = (
    job: SimJob,
    to: "scheduled" | "retryable",
    runAt: number,
    now: number,
    uncounted = to === "scheduled"
  ): JobState => {
    const holder = blocker(job, to)
    if (holder !== undefined) return supersede(job, holder, now)
    // the next claim counts it again, so this attempt nets to zero
    if (uncounted) job.attempt -= 1
    closeAttempt(job, now, to)
    job.runAt = runAt
    transition(job, to)
    return to
  }

  /**
   * Applies an outcome to an open attempt; returns the job's new state. `exhausted` is the DLQ
   * reason when a `Retry` has no attempts left (rescue passes its own).
   */
  const applyOutcome = (
    job: SimJob,
    outcome: Outcome,
    now: number,
    exhausted: DlqReason = "max_attempts_exhausted"
  ): JobState => {
    switch (outcome._tag) {
      case "Complete":
        job.progressJson = null
        return finish(job, "completed", now)
      case "Cancel":
        return cancel(job, outcome.reason, now)
      case "Fail":
        appendError(job, {
          error: outcome.error.slice(0, maxErrorMessageLength),
          attempt: job.attempt,
          at: iso(now),
          terminal: true
        })
        return fail(job, "terminal_error", now)
      case "Retry":
        // the entry that exhausts the attempts is marked terminal, as in Postgres
        appendError(job, {
          error: outcome.error.slice(0, maxErrorMessageLength),
          attempt: job.attempt,
          at: iso(now),
          ...(job.attempt >= job.maxAttempts ? { terminal: true } : {})
        })
        return job.attempt >= job.maxAttempts
          ? fail(job, exhausted, now)
          : defer(job, "retryable", now + outcome.delayMs, now)
      case "Snooze":
        return defer(job, "scheduled", now + outcome.delayMs, now)
      case "Release":
        // shutdown: retryable again after the delay, the attempt not counted, never exhausted
        appendError(job, {
          error: outcome.error.slice(0, maxErrorMessageLength),
          attempt: job.attempt,
          at: iso(now)
        })
        return defer(job, "retryable", now + outcome.delayMs, now, true)
    }
  }

  /** The job whose attempt `token` names, if that attempt is still open. */
  const openAttempt = (token: AttemptToken): SimJob | undefined => {
    const job = jobs.get(token.jobId)
    return job !== undefined && job.state === "running" && job.runLease === token.runLease ? job : undefined
  }

  const errorsOf = (job: SimJob): ReadonlyArray<ErrorEntry> => job.errors.map((entry) => ({ ...entry }))

  const view = (job: SimJob): JobView => ({
    id: job.id,
    kind: job.kind,
    queue: job.queue,
    priority: job.priority,
    state: parkedPending(job) ? "waiting_external" : job.state,
    attempt: job.attempt,
    maxAttempts: job.maxAttempts,
    runLease: job.runLease,
    args: JSON.parse(job.argsJson),
    metadata: JSON.parse(job.metadataJson),
    tags: [...job.tags],
    errors: errorsOf(job),
    progress: job.progressJson === null ? null : JSON.parse(job.progressJson),
    runAt: new Date(job.runAt),
    createdAt: new Date(job.createdAt),
    finalizedAt: isTerminal(job.state) && job.finalizedAt !== null ? new Date(job.finalizedAt) : null,
    dlqReason: job.dlq?.reason ?? null
  })

  const dlqEntry = (job: SimJob, mark: DlqMark): DlqEntry => ({
    id: job.id,
    kind: job.kind,
    queue: job.queue,
    priority: job.priority,
    args: JSON.parse(job.argsJson),
    metadata: JSON.parse(job.metadataJson),
    tags: [...job.tags],
    errors: errorsOf(job),
    progress: job.progressJson === null ? null : JSON.parse(job.progressJson),
    attempt: job.attempt,
    maxAttempts: job.maxAttempts,
    originalRunLease: mark.originalRunLease,
    runAt: new Date(job.runAt),
    createdAt: new Date(job.createdAt),
    dlqAt: new Date(mark.at),
    reason: mark.reason
  })

  const claimed = (job: SimJob, now: number): ClaimedJob => ({
    jobId: job.id,
    runLease: job.runLease,
    kind: job.kind,
    queue: job.queue,
    priority: job.priority,
    attempt: job.attempt,
    maxAttempts: job.maxAttempts,
    args: JSON.parse(job.argsJson),
    metadata: JSON.parse(job.metadataJson),
    tags: [...job.tags],
    errors: errorsOf(job),
    runAt: new Date(job.runAt),
    createdAt: new Date(job.createdAt),
    claimedAt: new Date(now),
    deadlineAt: job.deadlineAt === null ? null : new Date(job.deadlineAt),
    progress: job.progressJson === null ? null : JSON.parse(job.progressJson)
  })

  const notFound = (jobId: JobId) => Effect.fail(new JobNotFound({ jobId }))

  // ---------------------------------------------------------------------------------------------
  // Operations

  const enqueueMany = Effect.fnUntraced(function* (newJobs: ReadonlyArray<NewJob>) {
    const now = yield* Clock.currentTimeMillis
    const checked: Array<CheckedJob> = []
    for (const job of newJobs) checked.push(yield* checkNewJob(job, { nowMillis: now }))
    return yield* Effect.suspend(() => {
      const planned = checked.map((job, i): SimJob => {
        const runAt = job.runAt?.getTime() ?? now
        return {
          id: nextId + BigInt(i),
          kind: job.kind,
          queue: job.queue,
          priority: job.priority,
          maxAttempts: job.maxAttempts,
          argsJson: job.argsJson,
          metadataJson: job.metadataJson,
          tags: [...job.tags],
          createdAt: now,
          uniqueKey: job.uniqueKey === undefined ? undefined : UniqueKey.toHex(job.uniqueKey),
          uniqueStates: job.uniqueStates,
          state: runAt > now ? "scheduled" : "available",
          attempt: 0,
          runLease: 0n,
          runAt,
          errors: [],
          progressJson: null,
          claimedAt: null,
          deadlineAt: null,
          heartbeatAt: null,
          callback: null,
          finalizedAt: null,
          dlq: null
        }
      })
      const batchKeys = new Map<string, SimJob>()
      for (const job of planned) {
        if (job.uniqueKey === undefined || !maskHas(job.uniqueStates, job.state)) continue
        const holder = keys.get(job.uniqueKey) ?? batchKeys.get(job.uniqueKey)
        if (holder !== undefined) {
          return Effect.fail(new UniqueConflict({ key: job.uniqueKey, existingJobId: holder.id }))
        }
        batchKeys.set(job.uniqueKey, job)
      }
      nextId += BigInt(planned.length)
      for (const job of planned) {
        jobs.set(job.id, job)
        if (job.state === "available") enterLane(job)
        syncKey(job)
      }
      return Effect.succeed(
        planned.map(
          (job): EnqueuedJob => ({ id: job.id, state: job.state as EnqueuedJob["state"], queue: job.queue })
        )
      )
    })
  })

  const claim = Effect.fnUntraced(function* (params: ClaimParams) {
    const queue = yield* checkQueueName(params.queue)
    yield* checkInteger("max", params.max, 0, maxClaimBatch)
    const max = params.max
    const now = yield* Clock.currentTimeMillis
    return yield* Effect.sync((): ReadonlyArray<ClaimedJob> => {
      const queueLanes = lanes.get(queue)
      if (max === 0 || paused.has(queue) || queueLanes === undefined) return []
      const order = [...queueLanes.entries()]
        .filter(([, lane]) => lane.size > 0)
        .map(([priority, lane]) => ({
          priority,
          lane,
          headRunAt: lane.head()!.runAt,
          effective: Backoff.effectivePriority(priority, now - lane.head()!.runAt, params.agingIntervalMs)
        }))
        .sort((a, b) => a.effective - b.effective || a.headRunAt - b.headRunAt || a.priority - b.priority)
      const out: Array<ClaimedJob> = []
      for (const { lane } of order) {
        while (out.length < max && lane.size > 0) {
          const job = lane.head()!
          const holder = blocker(job, "running")
          if (holder !== undefined) {
            supersede(job, holder, now)
            continue
          }
          job.runLease += 1n
          job.attempt += 1
          job.claimedAt = now
          attempts.set(job.id, [
            ...(attempts.get(job.id) ?? []),
            {
              attempt: job.attempt,
              runLease: job.runLease,
              claimedAt: new Date(now),
              endedAt: null,
              outcome: null,
              durationMs: null
            }
          ])
          job.deadlineAt = params.deadlineMs > 0 ? now + params.deadlineMs : null
          job.heartbeatAt = null
          transition(job, "running")
          out.push(claimed(job, now))
        }
        if (out.length >= max) break
      }
      return out
    })
  })

  const isGrantOpen = (job: SimJob) =>
    job.grant !== undefined &&
    job.grant.lease === job.runLease &&
    (job.state === "running" || job.state === "waiting_external")

  const keyHooks: SimKeyHooks = {
    claimPrefix: (params, policy, admit, now) => {
      const queueLanes = lanes.get(params.queue)
      if (params.max <= 0 || paused.has(params.queue) || queueLanes === undefined) return []
      const max = Math.min(params.max, keyedWindow)
      const order = [...queueLanes.entries()]
        .filter(([, lane]) => lane.size > 0)
        .map(([priority, lane]) => ({
          priority,
          lane,
          headRunAt: lane.head()!.runAt,
          effective: Backoff.effectivePriority(priority, now - lane.head()!.runAt, params.agingIntervalMs)
        }))
        .sort((a, b) => a.effective - b.effective || a.headRunAt - b.headRunAt || a.priority - b.priority)
      const out: Array<ClaimedJob> = []
      for (const { lane } of order) {
        while (out.length < max && lane.size > 0) {
          const job = lane.head()!
          if (
            job.uniqueKey !== undefined &&
            maskHas(job.uniqueStates, "running") &&
            !maskHas(job.uniqueStates, "available")
          )
            break
          const key = concurrencyKeyOf(job)
          if (!admit(key)) break
          job.runLease += 1n
          job.attempt += 1
          job.claimedAt = now
          job.deadlineAt = params.deadlineMs > 0 ? now + params.deadlineMs : null
          job.heartbeatAt = null
          if (key !== undefined) job.grant = { policy, key, lease: job.runLease, at: now }
          transition(job, "running")
          out.push(claimed(job, now))
        }
        if (out.length >= max) break
      }
      return out
    },
    grants: () => {
      const out: Array<{ policy: string; key: string; at: number }> = []
      for (const job of jobs.values()) {
        if (isGrantOpen(job)) out.push({ policy: job.grant!.policy, key: job.grant!.key, at: job.grant!.at })
      }
      return out
    }
  }

  const finalizeMany = Effect.fnUntraced(function* (items: ReadonlyArray<FinalizeItem>) {
    yield* checkFinalizeItems(items)
    const now = yield* Clock.currentTimeMillis
    return yield* Effect.sync(() =>
      items.map((item): FinalizeResult => {
        const job = openAttempt(item)
        if (job === undefined) return { _tag: "Stale" }
        // written with the outcome, as Postgres does (completion clears it)
        if (item.progress != null) job.progressJson = JSON.stringify(item.progress)
        return { _tag: "Applied", state: applyOutcome(job, item.outcome, now) }
      })
    )
  })

  const heartbeatMany = Effect.fnUntraced(function* (items: ReadonlyArray<HeartbeatItem>) {
    const now = yield* Clock.currentTimeMillis
    return yield* Effect.sync(() => {
      const notOpen: Array<AttemptToken> = []
      for (const item of items) {
        const job = openAttempt(item)
        if (job === undefined) {
          notOpen.push({ jobId: item.jobId, runLease: item.runLease })
          continue
        }
        job.heartbeatAt = now
        if (item.progress != null) job.progressJson = JSON.stringify(item.progress)
      }
      return notOpen as ReadonlyArray<AttemptToken>
    })
  })

  const promoteDue = Effect.fnUntraced(function* (limit: number) {
    const now = yield* Clock.currentTimeMillis
    return yield* Effect.sync(() => {
      const due = [...jobs.values()]
        .filter((job) => (job.state === "scheduled" || job.state === "retryable") && job.runAt <= now)
        .sort((a, b) => a.runAt - b.runAt || (a.id < b.id ? -1 : 1))
        .slice(0, Math.max(0, Math.floor(limit)))
      for (const job of due) {
        const holder = blocker(job, "available")
        if (holder !== undefined) supersede(job, holder, now)
        else transition(job, "available")
      }
      return due.length
    })
  })

  const rescue = (
    reason: RescuedAttempt["reason"],
    isDue: (job: SimJob, now: number) => boolean,
    sortKey: (job: SimJob) => number,
    limit: number
  ) =>
    Effect.gen(function* () {
      const now = yield* Clock.currentTimeMillis
      const random = yield* Random.Random
      return yield* Effect.sync(() =>
        [...jobs.values()]
          .filter((job) => job.state === "running" && isDue(job, now))
          .sort((a, b) => sortKey(a) - sortKey(b) || (a.id < b.id ? -1 : 1))
          .slice(0, Math.max(0, Math.floor(limit)))
          .map((job): RescuedAttempt => {
            const token = { jobId: job.id, runLease: job.runLease }
            const delayMs = Backoff.defaultBackoffMs(job.attempt, random.nextDoubleUnsafe())
            const state = applyOutcome(
              job,
              { _tag: "Retry", delayMs, error: rescuedError[reason] },
              now,
              reason
            )
            return { ...token, reason, state, queue: job.queue, kind: job.kind }
          })
      )
    })

  const rescueStale = (params: RescueParams) =>
    rescue(
      "stale_heartbeat",
      (job, now) =>
        !parkedPending(job) &&
        Math.max(job.claimedAt!, job.heartbeatAt ?? job.claimedAt!) < now - params.stalenessMs,
      (job) => job.claimedAt!,
      params.limit
    )

  const rescueDeadlines = (limit: number) =>
    rescue(
      "deadline_exceeded",
      // a parked attempt's claim deadline is void: its callback timeout bounds it (0034)
      (job, now) => job.deadlineAt !== null && job.deadlineAt < now && job.callback?.parkedAt == null,
      (job) => job.deadlineAt!,
      limit
    )

  const pruneHistory = Effect.fnUntraced(function* (retention: RetentionParams) {
    const now = yield* Clock.currentTimeMillis
    return yield* Effect.sync((): PruneOutcome => {
      let deleted = 0
      for (const job of jobs.values()) {
        // dead-lettered jobs are kept by DLQ retention (`cleanupDlq`), not by history retention
        if (job.dlq !== null) continue
        const keepMs = retentionOf(retention, job.state)
        if (keepMs === undefined || job.finalizedAt === null || job.finalizedAt >= now - keepMs) continue
        remove(job)
        deleted++
      }
      if (deleted === 0) return { _tag: "Noop" }
      historyGeneration += 1n
      return { _tag: "Pruned", generation: historyGeneration, carried: 0 }
    })
  })

  const getJob = (id: JobId) =>
    Effect.suspend(() => {
      const job = jobs.get(id)
      return job === undefined ? notFound(id) : Effect.succeed(view(job))
    })

  const listJobs = Effect.fnUntraced(function* (filter: ListFilter) {
    yield* checkListLimit(filter)
    const limit = filter.limit ?? defaultListLimit
    return yield* Effect.sync(() => {
      const out: Array<JobView> = []
      for (const job of [...jobs.values()].reverse()) {
        if (out.length >= limit) break
        if (filter.before !== undefined && job.id >= filter.before) continue
        if (filter.queue !== undefined && job.queue !== filter.queue) continue
        if (filter.kind !== undefined && job.kind !== filter.kind) continue
        if (filter.state !== undefined && job.state !== filter.state) continue
        if (filter.tag !== undefined && !job.tags.includes(filter.tag)) continue
        if (filter.createdAfter !== undefined && job.createdAt < filter.createdAfter.getTime()) continue
        if (filter.createdBefore !== undefined && job.createdAt >= filter.createdBefore.getTime()) continue
        if (
          filter.finalizedAfter !== undefined &&
          !(job.finalizedAt !== null && job.finalizedAt >= filter.finalizedAfter.getTime())
        )
          continue
        if (
          filter.finalizedBefore !== undefined &&
          !(job.finalizedAt !== null && job.finalizedAt < filter.finalizedBefore.getTime())
        )
          continue
        out.push(view(job))
      }
      return out as ReadonlyArray<JobView>
    })
  })

  const jobDetail = (id: JobId) =>
    Effect.sync(
      (): JobDetail => ({
        uniqueKey: jobs.get(id)?.uniqueKey ?? null,
        attempts: attempts.get(id) ?? []
      })
    )

  const countByQueueState = Effect.sync((): ReadonlyArray<QueueStateCount> => {
    const counts = new Map<string, { queue: string; state: JobState; count: number }>()
    for (const job of jobs.values()) {
      const key = `${job.queue}\u0000${job.state}`
      const entry = counts.get(key)
      if (entry === undefined) counts.set(key, { queue: job.queue, state: job.state, count: 1 })
      else entry.count++
    }
    return [...counts.values()].sort(
      (a, b) =>
        CanonicalJson.compareUtf8(a.queue, b.queue) || (a.state < b.state ? -1 : a.state > b.state ? 1 : 0)
    )
  })

  // Mirrors queue_stats (migration 0030) over the simulation's own records: the open states from
  // the jobs, totals and `recent` from the finalization log, `stored` from the terminal jobs.
  const queueStats = (options: QueueStatsOptions = {}) =>
    Effect.gen(function* () {
      yield* checkStatsWindow(options.windowMs)
      const windowMs = options.windowMs ?? statsWindowMsRange.default
      const exact = options.exact === true
      const now = yield* Clock.currentTimeMillis
      const since = now - windowMs
      const zero = (): Mutable<FinalizedCounts> => ({ completed: 0, failed: 0, cancelled: 0 })
      type Entry = Omit<Mutable<QueueStats>, "finalizedTotal" | "recent" | "stored" | "rates"> & {
        oldest: number | null
        finalizedTotal: Mutable<FinalizedCounts>
        recent: Mutable<FinalizedCounts>
        stored: Mutable<FinalizedCounts> | null
      }
      const byQueue = new Map<string, Entry>()
      const entry = (queue: string) => {
        let e = byQueue.get(queue)
        if (e === undefined) {
          e = {
            queue,
            paused: paused.has(queue),
            available: 0,
            running: 0,
            scheduled: 0,
            retryable: 0,
            deadLettered: 0,
            oldestAvailableAt: null,
            oldest: null,
            finalizedTotal: zero(),
            recent: zero(),
            stored: exact ? zero() : null
          }
          byQueue.set(queue, e)
        }
        return e
      }
      for (const queue of paused) entry(queue)
      for (const queue of queueSettings.keys()) entry(queue)
      for (const job of jobs.values()) {
        const e = entry(job.queue)
        if (job.dlq !== null) e.deadLettered++
        else if (job.state === "available") {
          e.available++
          if (e.oldest === null || job.runAt < e.oldest) e.oldest = job.runAt
        } else if (job.state === "running") e.running++
        else if (job.state === "scheduled") e.scheduled++
        else if (job.state === "retryable") e.retryable++
        else if (
          e.stored !== null &&
          (job.state === "completed" || job.state === "failed" || job.state === "cancelled")
        )
          e.stored[job.state]++
      }
      for (const f of finalizations) {
        const e = entry(f.queue)
        e.finalizedTotal[f.state]++
        if (f.at >= since) e.recent[f.state]++
      }
      const queues = [...byQueue.values()]
        .sort((a, b) => CanonicalJson.compareUtf8(a.queue, b.queue))
        .map(
          ({ oldest, ...e }): Omit<QueueStats, "rates"> => ({
            ...e,
            oldestAvailableAt: oldest === null ? null : new Date(oldest)
          })
        )
      const { span, counts } = sampledRates(now, windowMs)
      return {
        asOf: new Date(now),
        exact,
        windowStart: new Date(since),
        staleness: `${statsStaleness}; ${ratesStaleness}`,
        rates: span,
        queues: queues.map((q) => ({
          ...q,
          rates:
            span === null
              ? null
              : toRates(counts.get(q.queue) ?? { enqueued: 0, completed: 0, failed: 0, cancelled: 0 }, span)
        }))
      } satisfies QueueStatsReport
    })

  // Mirrors queue_rates: sums over the samples in the window that have a predecessor.
  const sampledRates = (now: number, windowMs: number) => {
    const counts = new Map<string, FinalizedCounts & { enqueued: number }>()
    let span: { start: number; end: number; es: number | null; ee: number | null } | null = null
    samples.forEach((sample, i) => {
      if (sample.at <= now - windowMs || i === 0) return
      const prev = samples[i - 1]!.at
      span =
        span === null
          ? { start: prev, end: sample.at, es: sample.enqueuedFrom, ee: sample.enqueuedUntil }
          : { ...span, end: sample.at, ee: sample.enqueuedUntil }
      for (const [queue, q] of sample.queues) {
        const c = counts.get(queue) ?? { enqueued: 0, completed: 0, failed: 0, cancelled: 0 }
        counts.set(queue, {
          enqueued: c.enqueued + q.enqueued,
          completed: c.completed + q.completed,
          failed: c.failed + q.failed,
          cancelled: c.cancelled + q.cancelled
        })
      }
    })
    const s = span as { start: number; end: number; es: number | null; ee: number | null } | null
    return {
      counts,
      span:
        s === null
          ? null
          : ({
              start: new Date(s.start),
              end: new Date(s.end),
              enqueueStart: s.es === null ? null : new Date(s.es),
              enqueueEnd: s.ee === null ? null : new Date(s.ee)
            } satisfies RatesSpan)
    }
  }

  // Mirrors queue_history: sample rows of the window summed per queue and bucket.
  const queueHistory = (options: QueueHistoryOptions = {}) =>
    Effect.gen(function* () {
      yield* checkHistoryOptions(options.windowMs, options.bucketMs)
      const windowMs = options.windowMs ?? historyWindowMsRange.default
      const bucketMs = options.bucketMs ?? historyBucketMsRange.default
      const now = yield* Clock.currentTimeMillis
      const byQueue = new Map<string, Map<number, Mutable<HistoryBucket>>>()
      for (const sample of samples) {
        if (sample.at <= now - windowMs) continue
        const start = Math.floor(sample.at / bucketMs) * bucketMs
        for (const [queue, q] of sample.queues) {
          const buckets = byQueue.get(queue) ?? new Map<number, Mutable<HistoryBucket>>()
          byQueue.set(queue, buckets)
          const b = buckets.get(start) ?? {
            start: new Date(start),
            enqueued: 0,
            completed: 0,
            failed: 0,
            cancelled: 0
          }
          buckets.set(start, b)
          b.enqueued += q.enqueued
          b.completed += q.completed
          b.failed += q.failed
          b.cancelled += q.cancelled
        }
      }
      return {
        asOf: new Date(now),
        windowMs,
        bucketMs,
        queues: [...byQueue]
          .sort(([a], [b]) => CanonicalJson.compareUtf8(a, b))
          .map(([queue, buckets]) => ({ queue, buckets: [...buckets.values()] }))
      } satisfies QueueHistoryReport
    })

  // Mirrors sample_queue_stats: totals from queueStats, enqueues by id range one period late.
  const sampleQueueStats = (params: SampleParams) =>
    Effect.gen(function* () {
      const now = yield* Clock.currentTimeMillis
      const prev = samples.at(-1)
      if (prev !== undefined && prev.at > now - params.minIntervalMs) return null
      const report = yield* Effect.orDie(queueStats({ windowMs: 60_000 }))
      const hw = nextId - 1n
      const [from, to] = prev === undefined ? [hw, hw] : [prev.countedThrough, prev.hw]
      const born = new Map<string, number>()
      for (const job of jobs.values())
        if (job.id > from && job.id <= to) born.set(job.queue, (born.get(job.queue) ?? 0) + 1)
      const queues = new Map<string, FinalizedCounts & { enqueued: number; totals: FinalizedCounts }>()
      const names = new Set([...report.queues.map((q) => q.queue), ...born.keys()])
      for (const queue of names) {
        const totals = report.queues.find((q) => q.queue === queue)?.finalizedTotal ?? {
          completed: 0,
          failed: 0,
          cancelled: 0
        }
        const before = prev?.queues.get(queue)?.totals ?? { completed: 0, failed: 0, cancelled: 0 }
        const delta = (k: keyof FinalizedCounts) =>
          prev === undefined ? 0 : Math.max(0, totals[k] - before[k])
        queues.set(queue, {
          enqueued: born.get(queue) ?? 0,
          completed: delta("completed"),
          failed: delta("failed"),
          cancelled: delta("cancelled"),
          totals
        })
      }
      samples.push({
        at: now,
        hw,
        countedThrough: to,
        enqueuedFrom: samples.at(-2)?.at ?? null,
        enqueuedUntil: prev?.at ?? null,
        queues
      })
      while (samples.length > 0 && samples[0]!.at < now - params.keepMs) samples.shift()
      return new Date(now)
    })

  const recordPruneState = (ring: "queue" | "history", state: PruneState) =>
    Effect.map(Clock.currentTimeMillis, (now) => {
      const old = pruneStates.get(ring)
      if (old !== undefined && old.outcome === state.outcome && old.reason === state.reason) return false
      pruneStates.set(ring, { ...state, since: now })
      return true
    })

  // Mirrors cancel_by_unique_key: the key's holder, cancelled only if it is not terminal.
  const cancelByUniqueKey = (key: string, reason: string) =>
    Effect.flatMap(Clock.currentTimeMillis, (now) =>
      Effect.sync((): Option.Option<JobId> => {
        const holder = keys.get(key)
        if (holder === undefined || isTerminal(holder.state)) return Option.none()
        cancel(holder, reason, now)
        return Option.some(holder.id)
      })
    )

  const cancelJob = (id: JobId, reason: string) =>
    Effect.flatMap(Clock.currentTimeMillis, (now) =>
      Effect.suspend((): Effect.Effect<JobView, JobNotFound | InvalidTransition> => {
        const job = jobs.get(id)
        if (job === undefined) return notFound(id)
        if (isTerminal(job.state)) {
          return Effect.fail(new InvalidTransition({ jobId: id, from: job.state, action: "cancel" }))
        }
        // Unclaimed, deferred or running alike: a running attempt closes exactly like a `Cancel` outcome.
        cancel(job, reason, now)
        return Effect.succeed(view(job))
      })
    )

  const retryJob = (id: JobId) =>
    Effect.flatMap(Clock.currentTimeMillis, (now) =>
      Effect.suspend((): Effect.Effect<JobView, JobNotFound | InvalidTransition | UniqueConflict> => {
        const job = jobs.get(id)
        if (job === undefined) return notFound(id)
        if (job.state !== "failed" && job.state !== "cancelled") {
          return Effect.fail(new InvalidTransition({ jobId: id, from: job.state, action: "retry" }))
        }
        const holder = blocker(job, "available")
        if (holder !== undefined) {
          return Effect.fail(new UniqueConflict({ key: job.uniqueKey!, existingJobId: holder.id }))
        }
        // a dead-lettered job retried this way leaves the DLQ, as with `retryFromDlq` without overrides
        undead(job)
        job.attempt = 0
        job.runAt = now
        job.finalizedAt = null
        transition(job, "available")
        return Effect.succeed(view(job))
      })
    )

  const pauseQueue = (queue: string) =>
    Effect.flatMap(checkQueueName(queue), (name) => Effect.sync(() => void paused.add(name)))

  const resumeQueue = (queue: string) =>
    Effect.flatMap(checkQueueName(queue), (name) => Effect.sync(() => void paused.delete(name)))

  // ---------------------------------------------------------------------------------------------
  // Dead letter queue and queue settings (capability 19)

  const configureQueue = Effect.fnUntraced(function* (queue: string, settings: QueueSettings) {
    const name = yield* checkQueueName(queue)
    const retentionMs = settings.dlqRetentionMs
    if (retentionMs !== undefined && retentionMs !== null) {
      yield* checkInteger("dlqRetentionMs", retentionMs, 1, maxDlqRetentionMs)
    }
    // Checked as on Postgres; not used: one lane per priority is strict FIFO, which is every order
    // a sharded queue may show (QueueSettings.enqueueShards).
    if (settings.enqueueShards !== undefined) {
      yield* checkInteger("enqueueShards", settings.enqueueShards, 1, maxEnqueueShards)
    }
    yield* Effect.sync(() => {
      const current = queueSettings.get(name) ?? { dlq: null, dlqRetentionMs: null }
      if (settings.dlq !== undefined) current.dlq = settings.dlq
      if (retentionMs !== undefined) current.dlqRetentionMs = retentionMs
      queueSettings.set(name, current)
    })
  })

  const setDlqDefault = (enabled: boolean) =>
    Effect.sync(() => {
      dlqDefault = enabled
    })

  // Nothing to skip here: the simulation's wake-ups are in memory. Kept so that a test reads back
  // what it set, as from Postgres (a new install starts with it on).
  let wakeOnDemand = true
  const setWakeOnDemand = (enabled: boolean) =>
    Effect.sync(() => {
      wakeOnDemand = enabled
    })

  /** Dead-lettered jobs matching the filter (its `limit` aside), newest id first. */
  const matchingDlq = (filter: DlqFilter): Array<SimJob> => {
    const since = filter.since?.getTime()
    const until = filter.until?.getTime()
    return [...deadLetters.values()]
      .filter((job) => {
        const at = job.dlq!.at
        if (filter.before !== undefined && job.id >= filter.before) return false
        if (filter.queue !== undefined && job.queue !== filter.queue) return false
        if (filter.kind !== undefined && job.kind !== filter.kind) return false
        if (filter.tag !== undefined && !job.tags.includes(filter.tag)) return false
        if (since !== undefined && !(at >= since)) return false
        if (until !== undefined && !(at < until)) return false
        return true
      })
      .sort((a, b) => (a.id < b.id ? 1 : a.id > b.id ? -1 : 0))
  }

  const listDlq = Effect.fnUntraced(function* (filter: DlqFilter) {
    yield* checkDlqLimit(filter)
    const limit = filter.limit ?? 50
    return yield* Effect.sync(
      (): ReadonlyArray<DlqEntry> =>
        matchingDlq(filter)
          .slice(0, limit)
          .map((job) => dlqEntry(job, job.dlq!))
    )
  })

  const getDlq = (id: JobId) =>
    Effect.suspend(() => {
      const job = deadLetters.get(id)
      return job === undefined ? notFound(id) : Effect.succeed(dlqEntry(job, job.dlq!))
    })

  interface CheckedOverrides {
    readonly queue: string | undefined
    readonly priority: number | undefined
    readonly runAt: number | undefined
  }

  const checkOverrides = Effect.fnUntraced(function* (overrides: DlqRetryOverrides) {
    const queue = overrides.queue === undefined ? undefined : yield* checkQueueName(overrides.queue)
    if (overrides.priority !== undefined) {
      yield* checkInteger("priority", overrides.priority, limits.minPriority, limits.maxPriority)
    }
    const runAt = overrides.runAt
    if (runAt !== undefined && (!(runAt instanceof Date) || Number.isNaN(runAt.getTime()))) {
      return yield* new ValidationError({ field: "runAt", reason: "must be a valid Date" })
    }
    return { queue, priority: overrides.priority, runAt: runAt?.getTime() } satisfies CheckedOverrides
  })

  /**
   * Moves a dead-lettered job back to work (available, or scheduled for a future `runAt`) with a
   * fresh lane position, attempt 0 and its run lease unchanged. Returns the conflict instead, and
   * changes nothing, when another job holds the key the job would need.
   */
  const revive = (job: SimJob, overrides: CheckedOverrides, now: number): UniqueConflict | undefined => {
    const runAt = overrides.runAt ?? now
    const to = runAt > now ? "scheduled" : "available"
    const holder = blocker(job, to)
    if (holder !== undefined) return new UniqueConflict({ key: job.uniqueKey!, existingJobId: holder.id })
    undead(job)
    job.queue = overrides.queue ?? job.queue
    job.priority = overrides.priority ?? job.priority
    job.attempt = 0
    job.runAt = runAt
    job.finalizedAt = null
    transition(job, to)
    return undefined
  }

  const retryFromDlq = Effect.fnUntraced(function* (id: JobId, overrides: DlqRetryOverrides = {}) {
    const checked = yield* checkOverrides(overrides)
    const now = yield* Clock.currentTimeMillis
    return yield* Effect.suspend((): Effect.Effect<JobView, JobNotFound | UniqueConflict> => {
      const job = deadLetters.get(id)
      if (job === undefined) return notFound(id)
      const conflict = revive(job, checked, now)
      return conflict === undefined ? Effect.succeed(view(job)) : Effect.fail(conflict)
    })
  })

  const purgeDlq = (id: JobId) =>
    Effect.suspend(() => {
      const job = deadLetters.get(id)
      if (job === undefined) return notFound(id)
      remove(job)
      return Effect.void
    })

  // One step: the whole action is one batch (Postgres reports every 500).
  const reportBatch = (progress: BulkProgress | undefined, done: number) =>
    progress?.onBatch !== undefined && done > 0 ? progress.onBatch(done) : Effect.void

  // Bulk retry goes oldest id first, so of two entries sharing a unique key the older one wins.
  const retryDlqBulk = Effect.fnUntraced(function* (
    filter: DlqFilter,
    options?: { readonly all?: boolean | undefined } & BulkProgress
  ) {
    yield* checkBulkFilter("retryDlqBulk", filter, options ?? {})
    const now = yield* Clock.currentTimeMillis
    const retried = yield* Effect.sync(() => {
      const none = { queue: undefined, priority: undefined, runAt: undefined }
      let n = 0
      for (const job of matchingDlq(filter).reverse()) {
        if (revive(job, none, now) === undefined) n++
      }
      return n
    })
    yield* reportBatch(options, retried)
    return retried
  })

  const purgeDlqBulk = Effect.fnUntraced(function* (
    filter: DlqFilter,
    options?: { readonly all?: boolean | undefined } & BulkProgress
  ) {
    yield* checkBulkFilter("purgeDlqBulk", filter, options ?? {})
    const purged = yield* Effect.sync(() => {
      const matching = matchingDlq(filter)
      for (const job of matching) remove(job)
      return matching.length
    })
    yield* reportBatch(options, purged)
    return purged
  })

  const cleanupDlq = (defaultRetentionMs: number, batch: number) =>
    Effect.flatMap(Clock.currentTimeMillis, (now) =>
      Effect.sync(() => {
        const expired = [...deadLetters.values()]
          .filter((job) => {
            const keepMs = queueSettings.get(job.queue)?.dlqRetentionMs ?? defaultRetentionMs
            return job.dlq!.at < now - keepMs
          })
          .sort((a, b) => a.dlq!.at - b.dlq!.at || (a.id < b.id ? -1 : 1))
          .slice(0, Math.max(0, Math.floor(batch)))
        for (const job of expired) remove(job)
        return expired.length
      })
    )

  const drainQueue = Effect.fnUntraced(function* (queue: string, reason: string, progress?: BulkProgress) {
    const name = yield* checkQueueName(queue)
    const now = yield* Clock.currentTimeMillis
    const drained = yield* Effect.sync(() => {
      const waiting = [...jobs.values()].filter(
        (job) =>
          job.queue === name &&
          (job.state === "available" || job.state === "scheduled" || job.state === "retryable")
      )
      for (const job of waiting) cancel(job, reason, now)
      return waiting.length
    })
    yield* reportBatch(progress, drained)
    return drained
  })

  const status: StorageStatus = { generation: 0n, slot: 0, oldestUnpruned: null, historyGeneration: 0n }

  // No rings, but the same checks as Postgres on the policy a caller passes.
  const rotateWhenDue = (policy: RotatePolicy) =>
    Effect.gen(function* () {
      if (policy.minRows !== undefined)
        yield* checkInteger("minRows", policy.minRows, rotateMinRowsRange.min, rotateMinRowsRange.max)
      if (policy.maxAgeMs !== undefined)
        yield* checkInteger("maxAgeMs", policy.maxAgeMs, rotateMaxAgeMsRange.min, rotateMaxAgeMsRange.max)
      return "SkippedIdle" as const
    })
  const prune = (params: PruneParams) =>
    params.carryAfterMs === undefined
      ? Effect.succeed<PruneOutcome>({ _tag: "Noop" })
      : Effect.as(
          checkInteger(
            "carryAfterMs",
            params.carryAfterMs,
            pruneCarryAfterMsRange.min,
            pruneCarryAfterMsRange.max
          ),
          { _tag: "Noop" } as PruneOutcome
        )

  const openAttempts = function* (): Generator<SimJob> {
    for (const job of jobs.values()) if (job.state === "running") yield job
  }
  const callbacks = SimCallbackStorage.make({
    open: (token) => openAttempt(token),
    known: (token) => {
      const job = jobs.get(token.jobId)
      return job !== undefined && job.runLease >= token.runLease
    },
    close: (attempt, outcome, now, reason) =>
      applyOutcome(attempt as SimJob, outcome, now, (reason ?? "max_attempts_exhausted") as DlqReason),
    openAttempts,
    claimed: (attempt, now) => claimed(attempt as SimJob, now)
  })

  const service = QueueStorage.of({
    enqueueMany,
    claim,
    finalizeMany,
    heartbeatMany,
    promoteDue,
    rescueStale,
    rescueDeadlines,
    rotate: Effect.succeed("SkippedIdle"),
    rotateWhenDue,
    prune,
    rotateHistory: () => Effect.succeed("SkippedIdle"),
    pruneHistory,
    trimLedgers: () => Effect.succeed({ deleted: 0, more: false }),
    getJob,
    listJobs,
    countByQueueState,
    queueStats,
    jobDetail,
    queueHistory,
    sampleQueueStats,
    recordPruneState,
    cancelJob,
    cancelByUniqueKey,
    retryJob,
    pauseQueue,
    resumeQueue,
    status: Effect.succeed(status),
    configureQueue,
    setDlqDefault,
    wakeOnDemand: Effect.sync(() => wakeOnDemand),
    setWakeOnDemand,
    listDlq,
    getDlq,
    retryFromDlq,
    purgeDlq,
    retryDlqBulk,
    purgeDlqBulk,
    cleanupDlq,
    drainQueue
  })
  simHooks.set(service, keyHooks)
  return { storage: service, callbacks }
})

export const make: Effect.Effect<QueueStorage["Service"]> = Effect.map(
  makeWithCallbacks,
  (both) => both.storage
)

/**
 * `QueueStorage` and `CallbackStorage` in memory, over one store; each build of the layer starts
 * with an empty store.
 */
export const layer: Layer.Layer<QueueStorage | CallbackStorage> = Layer.effectContext(
  Effect.map(makeWithCallbacks, ({ callbacks, storage }) =>
    Context.add(Context.make(QueueStorage, storage), CallbackStorage, callbacks)
  )
)
