/**
 * `QueueStorage`: every read and write of job tables goes through this service (capability 2,
 * storage-engine.md). Two layers implement it with the same observable semantics:
 * `PgQueueStorage` (the append-only ring engine on Postgres) and `SimQueueStorage` (in memory,
 * deterministic under `TestClock`). One contract suite (`test/contract/QueueStorageContract.ts`)
 * runs unchanged against both.
 *
 * **Guarantees**
 * - `enqueueMany` is all-or-nothing and joins the caller's open `@effect/sql` transaction.
 * - Strict FIFO per lane `(queue, priority, shard)`; lanes are served by effective priority
 *   (claim-time aging), then head `runAt`, then stored priority.
 * - Every claim increments `runLease`; each `(jobId, runLease)` is handed out once. Every later
 *   attempt-scoped write is guarded by it: a write for an attempt that is no longer open changes
 *   nothing and is reported as `"stale"` (a value, not an error).
 */
import type {
  InvalidTransition,
  JobNotFound,
  JobState,
  NewJob,
  ReadCommittedRequired,
  UniqueConflict,
  UnsafeBulkFilter,
  ValidationError
} from "@awa/core"
import { Context, type Effect, type Option } from "effect"
import type { SqlError } from "effect/sql"

export type JobId = bigint

/** Identity of one attempt; every attempt-scoped write requires it. */
export interface AttemptToken {
  readonly jobId: JobId
  readonly runLease: bigint
}

export interface EnqueuedJob {
  readonly id: JobId
  readonly state: "available" | "scheduled"
  readonly queue: string
}

export interface ErrorEntry {
  readonly error: string
  readonly attempt: number
  readonly at: string
  readonly terminal?: boolean | undefined
}

/** An immutable snapshot handed to the worker at claim; the completion path needs nothing else. */
export interface ClaimedJob extends AttemptToken {
  readonly kind: string
  readonly queue: string
  readonly priority: number
  readonly attempt: number
  readonly maxAttempts: number
  readonly args: unknown
  readonly metadata: Readonly<Record<string, unknown>>
  readonly tags: ReadonlyArray<string>
  readonly errors: ReadonlyArray<ErrorEntry>
  readonly runAt: Date
  readonly createdAt: Date
  readonly claimedAt: Date
  readonly deadlineAt: Date | null
  /**
   * The job's progress when it was claimed: the checkpoint the previous attempt left (written with
   * its outcome, by a heartbeat or kept by a rescue), `null` when there is none.
   */
  readonly progress: Readonly<Record<string, unknown>> | null
}

export interface ClaimParams {
  readonly queue: string
  readonly max: number
  /** Hard deadline stamped on each claim; 0 = none. */
  readonly deadlineMs: number
  /** Priority aging interval; 0 disables aging. */
  readonly agingIntervalMs: number
}

/** What the handler's attempt came to. Delays are durations: storage adds them to its own clock. */
export type Outcome =
  | { readonly _tag: "Complete" }
  /** A failure: backoff then retry, or `failed` once `attempt >= maxAttempts`. */
  | { readonly _tag: "Retry"; readonly delayMs: number; readonly error: string }
  /** Not a failure: the attempt is not counted. */
  | { readonly _tag: "Snooze"; readonly delayMs: number }
  /**
   * An attempt cut off by worker shutdown: runnable again after `delayMs` (the worker sends 0)
   * with the attempt not counted, `error` appended to the job's errors (never terminal). A job
   * on its last attempt survives a rolling deploy (capabilities.md §7).
   */
  | { readonly _tag: "Release"; readonly delayMs: number; readonly error: string }
  | { readonly _tag: "Cancel"; readonly reason: string }
  /** Terminal failure: no retry whatever attempts remain. */
  | { readonly _tag: "Fail"; readonly error: string }

export interface FinalizeItem extends AttemptToken {
  readonly outcome: Outcome
  /**
   * The attempt's progress (a JSON object), written in the same statement as the outcome: kept
   * by retry, snooze, fail and cancel, cleared by completion. Unset (or `null`, as a spread
   * `ClaimedJob` without progress has) keeps what a heartbeat wrote.
   */
  readonly progress?: Readonly<Record<string, unknown>> | null | undefined
}

export type FinalizeResult =
  | { readonly _tag: "Applied"; readonly state: JobState }
  | { readonly _tag: "Stale" }

export interface HeartbeatItem extends AttemptToken {
  /** Replaces the attempt's progress snapshot when given (a JSON object; `null` = not given). */
  readonly progress?: Readonly<Record<string, unknown>> | null | undefined
}

export interface RescueParams {
  /** Attempts whose last sign of life is older than this are rescued (stale-heartbeat sweep). */
  readonly stalenessMs: number
  readonly limit: number
}

export interface RescuedAttempt extends AttemptToken {
  readonly reason: "stale_heartbeat" | "deadline_exceeded" | "callback_timeout"
  readonly state: JobState
  /** The job's queue and kind (for metrics); empty when its rows were reclaimed meanwhile. */
  readonly queue: string
  readonly kind: string
}

export type RotateOutcome = "Rotated" | "SkippedIdle" | "SkippedBusy" | "SkippedLocked"

export type PruneOutcome =
  | { readonly _tag: "Pruned"; readonly generation: bigint; readonly carried: number }
  | { readonly _tag: "Noop" }
  | {
      readonly _tag: "Blocked"
      /** `retention`: history only, its oldest slot holds rows younger than the longest retention. */
      readonly reason: "unclaimed" | "lock" | "locked_attempt" | "young_attempts" | "busy" | "retention"
    }

export interface RetentionParams {
  readonly completedMs: number
  readonly failedMs: number
  readonly cancelledMs: number
}

/** Queue-ring prune: the retention, and optionally the carry threshold (else the layer's). */
export interface PruneParams extends RetentionParams {
  /**
   * Leave a sealed slot alone (`Blocked: young_attempts`) while one of its open attempts was
   * claimed less than this long ago; 0 carries at once. Unset: the storage layer's
   * `pruneCarryAfterMs`. 0–3,600,000.
   */
  readonly carryAfterMs?: number | undefined
  /**
   * Queue for the slot's locks for up to this long (ms, clamped to 1–5,000) instead of retrying
   * NOWAIT: the leader's answer to a prune blocked on its lock tick after tick (ADR 0018). Readers
   * of the slot stall that long at most. Unset: NOWAIT.
   */
  readonly forceLockTimeoutMs?: number | undefined
}

/** When the queue ring moves on; an unset field takes the storage layer's value. */
export interface RotatePolicy {
  /** Rotate once the current slot holds this many ready rows (1–10,000,000; 1 = whenever it has rows). */
  readonly minRows?: number | undefined
  /** …or once it is this old, in ms (0–3,600,000). */
  readonly maxAgeMs?: number | undefined
}

/** What one `trimLedgers` call deleted from the ring ledgers (rotations, prunes, history copies). */
export interface LedgerTrim {
  readonly deleted: number
  /** Some ledger still holds rows below its newest wrap (the batch was full): call again. */
  readonly more: boolean
}

/** A job as readers see it, in whatever representation currently holds it. */
export interface JobView {
  readonly id: JobId
  readonly kind: string
  readonly queue: string
  readonly priority: number
  readonly state: JobState
  readonly attempt: number
  readonly maxAttempts: number
  readonly runLease: bigint
  readonly args: unknown
  readonly metadata: Readonly<Record<string, unknown>>
  readonly tags: ReadonlyArray<string>
  readonly errors: ReadonlyArray<ErrorEntry>
  readonly progress: unknown
  readonly runAt: Date
  readonly createdAt: Date
  readonly finalizedAt: Date | null
  /** Why the job sits in the dead letter queue; `null` when it is not there. */
  readonly dlqReason: string | null
}

export interface ListFilter {
  readonly queue?: string | undefined
  readonly kind?: string | undefined
  readonly state?: JobState | undefined
  readonly tag?: string | undefined
  /** Keyset pagination: only ids strictly below this (results are newest first). */
  readonly before?: JobId | undefined
  /** Only jobs created at or after this instant. */
  readonly createdAfter?: Date | undefined
  /** Only jobs created before this instant. */
  readonly createdBefore?: Date | undefined
  /** Only jobs finalized at or after this instant (so only terminal ones). */
  readonly finalizedAfter?: Date | undefined
  /** Only jobs finalized before this instant (so only terminal ones). */
  readonly finalizedBefore?: Date | undefined
  /** 1–1000, default 100. */
  readonly limit?: number | undefined
}

/** One attempt of a job: claimed, and closed (with the state it left the job in) or still open. */
export interface AttemptView {
  readonly attempt: number
  readonly runLease: bigint
  readonly claimedAt: Date
  readonly endedAt: Date | null
  /** The job's state when the attempt closed (`completed`, `retryable`, …); `null` while open. */
  readonly outcome: string | null
  /** `endedAt − claimedAt`; `null` while open. */
  readonly durationMs: number | null
}

/**
 * What the job page adds to a `JobView`: the unique key (hex) and the attempts whose claim rows
 * are still stored (the queue ring's unreclaimed slots on Postgres: attempts of a job already
 * moved to history are only in its error list).
 */
export interface JobDetail {
  readonly uniqueKey: string | null
  readonly attempts: ReadonlyArray<AttemptView>
}

/** Why a job was dead-lettered (capabilities.md §19), or an operator's own text. */
export type DlqReason =
  | "max_attempts_exhausted"
  | "terminal_error"
  | "stale_heartbeat"
  | "deadline_exceeded"
  | "callback_timeout"
  | (string & {})

/** A dead-lettered job: its body, full error history, progress and the lease it failed with. */
export interface DlqEntry {
  readonly id: JobId
  readonly kind: string
  readonly queue: string
  readonly priority: number
  readonly args: unknown
  readonly metadata: Readonly<Record<string, unknown>>
  readonly tags: ReadonlyArray<string>
  readonly errors: ReadonlyArray<ErrorEntry>
  readonly progress: unknown
  readonly attempt: number
  readonly maxAttempts: number
  readonly originalRunLease: bigint
  readonly runAt: Date
  readonly createdAt: Date
  readonly dlqAt: Date
  readonly reason: DlqReason
}

export interface DlqFilter {
  readonly queue?: string | undefined
  readonly kind?: string | undefined
  readonly tag?: string | undefined
  /** Only entries dead-lettered at or after this instant. */
  readonly since?: Date | undefined
  /** Only entries dead-lettered before this instant. */
  readonly until?: Date | undefined
  /** Keyset pagination: only ids strictly below this (results are newest id first). */
  readonly before?: JobId | undefined
  /** 1–1000, default 50. */
  readonly limit?: number | undefined
}

export interface DlqRetryOverrides {
  readonly queue?: string | undefined
  readonly priority?: number | undefined
  /** Later than now ⇒ scheduled; otherwise available at once. */
  readonly runAt?: Date | undefined
}

export interface QueueSettings {
  /** Dead-letter this queue's failed jobs; `null` falls back to the global default. */
  readonly dlq?: boolean | null | undefined
  /** How long DLQ entries of this queue are kept; `null` falls back to the cleanup default. */
  readonly dlqRetentionMs?: number | null | undefined
  /**
   * Sharded enqueue heads (capabilities.md §22): each priority of the queue is spread over this
   * many lanes from the next insert on, so concurrent producers and claimers of one hot queue do
   * not wait for each other's lane. Strict FIFO per priority becomes FIFO per shard: jobs with one
   * `orderingKey` (else one `concurrencyKey`) share a shard and keep insert order; other insert
   * transactions take the shards in turn. Integer 1–64; default 1 (one lane, strict FIFO).
   * Lowering it is safe: the jobs of the old shards are still claimed. The Postgres layer only;
   * the simulation layer stores it and keeps one lane per priority (strict FIFO, which is every
   * order a sharded queue may show).
   */
  readonly enqueueShards?: number | undefined
}

export interface QueueStateCount {
  readonly queue: string
  readonly state: JobState
  readonly count: number
}

export interface StorageStatus {
  readonly generation: bigint
  readonly slot: number
  readonly oldestUnpruned: bigint | null
  readonly historyGeneration: bigint
}

/** Finalizations of one queue, by outcome. */
export interface FinalizedCounts {
  readonly completed: number
  readonly failed: number
  readonly cancelled: number
}

/**
 * One queue's statistics (issue 18; docs/adr/0024-operator-surface.md). The open-work counts are
 * exact at the report's `asOf`; they cost the queue's live work (backlog, open attempts, deferred
 * and dead-lettered jobs), never its finished history.
 */
export interface QueueStats {
  readonly queue: string
  readonly paused: boolean
  /** Claimable now (parked jobs included). */
  readonly available: number
  /** Open attempts. */
  readonly running: number
  readonly scheduled: number
  readonly retryable: number
  /** Held in the dead letter queue (their state reads `failed`). */
  readonly deadLettered: number
  /** `runAt` of the oldest available job (the lane heads); `null` when none is available. */
  readonly oldestAvailableAt: Date | null
  /** Jobs finalized since install (retried ones too; dead-lettered ones count in `deadLettered`). */
  readonly finalizedTotal: FinalizedCounts
  /** Jobs finalized since the report's `windowStart`. */
  readonly recent: FinalizedCounts
  /**
   * Terminal jobs still stored (history kept for its retention): only in an exact report
   * (`exact: true`), which counts every stored row; `null` otherwise.
   */
  readonly stored: FinalizedCounts | null
  /**
   * Per-second rates over the report's `rates` span, from the leader's samples (migration 0031);
   * `null` when no two samples fall in the window (no leader, or it started less than two sample
   * periods ago).
   */
  readonly rates: QueueRates | null
}

/** Jobs per second, and the counts they come from. */
export interface QueueRates {
  readonly enqueued: number
  readonly completed: number
  readonly failed: number
  readonly cancelled: number
  readonly enqueuedPerSecond: number
  readonly completedPerSecond: number
  readonly failedPerSecond: number
  readonly cancelledPerSecond: number
}

/** The spans the sampled rates cover (finalizations, and enqueues one sample period earlier). */
export interface RatesSpan {
  readonly start: Date
  readonly end: Date
  readonly enqueueStart: Date | null
  readonly enqueueEnd: Date | null
}

/** One bucket of a queue's sampled history. */
export interface HistoryBucket {
  readonly start: Date
  readonly enqueued: number
  readonly completed: number
  readonly failed: number
  readonly cancelled: number
}

export interface QueueHistoryOptions {
  /** How far back, ms (60,000–7,200,000; default 3,600,000). */
  readonly windowMs?: number | undefined
  /** Bucket width, ms (1,000–3,600,000; default 60,000). */
  readonly bucketMs?: number | undefined
}

/**
 * Per-queue series from the leader's samples (migration 0031): counts per bucket; buckets
 * without a sample are absent. Enqueue counts describe the sample period before the bucket's.
 */
export interface QueueHistoryReport {
  readonly asOf: Date
  readonly windowMs: number
  readonly bucketMs: number
  readonly queues: ReadonlyArray<{ readonly queue: string; readonly buckets: ReadonlyArray<HistoryBucket> }>
}

export interface SampleParams {
  /** Skip when the last sample is younger than this (another leader just sampled). */
  readonly minIntervalMs: number
  /** Delete samples older than this. */
  readonly keepMs: number
}

/** A ring's prune state as the leader last recorded it: `ok`, or `blocked` with the reason. */
export interface PruneState {
  readonly outcome: "ok" | "blocked"
  readonly reason: string | null
}

export interface QueueStatsOptions {
  /** Span of `recent`, in ms (1,000–86,400,000; default 300,000). */
  readonly windowMs?: number | undefined
  /** Also count stored terminal jobs (`stored`): a scan of every stored job, slow on a large history. */
  readonly exact?: boolean | undefined
}

export interface QueueStatsReport {
  /** The instant every count describes (the database's clock on Postgres). */
  readonly asOf: Date
  readonly exact: boolean
  /**
   * Start of the `recent` window: `asOf − windowMs`, or later when the storage keeps finer
   * records only for a shorter span (then the window is shorter, never padded).
   */
  readonly windowStart: Date
  /**
   * What may lag behind `asOf`, in words: the counts do not; `recent` dates a reclaimed ring slot's
   * finalizations by when the slot was reclaimed.
   */
  readonly staleness: string
  /** The span the queues' `rates` cover; `null` without samples. */
  readonly rates: RatesSpan | null
  readonly queues: ReadonlyArray<QueueStats>
}

/** Progress of a bulk action that runs in batches (drain, DLQ retry/purge). */
export interface BulkProgress {
  /** Called after each committed batch with the running total (not called when nothing matched). */
  readonly onBatch?: ((done: number) => Effect.Effect<void>) | undefined
}

export type EnqueueError = ValidationError | UniqueConflict | SqlError.SqlError

export class QueueStorage extends Context.Service<
  QueueStorage,
  {
    /** Enqueues jobs all-or-nothing, inside the caller's transaction when there is one. */
    readonly enqueueMany: (
      jobs: ReadonlyArray<NewJob>
    ) => Effect.Effect<ReadonlyArray<EnqueuedJob>, EnqueueError>
    /** Claims up to `max` jobs of one queue in one round trip; empty when paused or idle. */
    readonly claim: (
      params: ClaimParams
    ) => Effect.Effect<ReadonlyArray<ClaimedJob>, ValidationError | ReadCommittedRequired | SqlError.SqlError>
    /** Finalizes attempts in one transaction; one result per item, in order. */
    readonly finalizeMany: (
      items: ReadonlyArray<FinalizeItem>
    ) => Effect.Effect<
      ReadonlyArray<FinalizeResult>,
      ValidationError | ReadCommittedRequired | SqlError.SqlError
    >
    /** Records liveness (and progress) for open attempts; returns the tokens that are no longer open. */
    readonly heartbeatMany: (
      items: ReadonlyArray<HeartbeatItem>
    ) => Effect.Effect<ReadonlyArray<AttemptToken>, ReadCommittedRequired | SqlError.SqlError>
    /** Moves due scheduled/retryable jobs to their lanes; returns how many moved. */
    readonly promoteDue: (limit: number) => Effect.Effect<number, ReadCommittedRequired | SqlError.SqlError>
    readonly rescueStale: (
      params: RescueParams
    ) => Effect.Effect<ReadonlyArray<RescuedAttempt>, ReadCommittedRequired | SqlError.SqlError>
    readonly rescueDeadlines: (
      limit: number
    ) => Effect.Effect<ReadonlyArray<RescuedAttempt>, ReadCommittedRequired | SqlError.SqlError>
    /** Rotates the queue ring when due by the storage layer's policy. */
    readonly rotate: Effect.Effect<RotateOutcome, ReadCommittedRequired | SqlError.SqlError>
    /** Rotates the queue ring when due by `policy` (unset fields: the layer's policy). */
    readonly rotateWhenDue: (
      policy: RotatePolicy
    ) => Effect.Effect<RotateOutcome, ValidationError | ReadCommittedRequired | SqlError.SqlError>
    readonly prune: (
      params: PruneParams
    ) => Effect.Effect<PruneOutcome, ValidationError | ReadCommittedRequired | SqlError.SqlError>
    readonly rotateHistory: (
      intervalMs: number
    ) => Effect.Effect<RotateOutcome, ReadCommittedRequired | SqlError.SqlError>
    readonly pruneHistory: (
      retention: RetentionParams
    ) => Effect.Effect<PruneOutcome, ReadCommittedRequired | SqlError.SqlError>
    /**
     * Deletes ring-ledger rows no reader needs any more (below each ring's newest wrap), at most
     * `batch` per ledger and ring, once a whole wrap has piled up; lifetime prune totals are
     * carried, not lost (migration 0017).
     */
    readonly trimLedgers: (
      batch: number
    ) => Effect.Effect<LedgerTrim, ReadCommittedRequired | SqlError.SqlError>
    readonly getJob: (id: JobId) => Effect.Effect<JobView, JobNotFound | SqlError.SqlError>
    /** The job's unique key and stored attempts (empty for an unknown id). */
    readonly jobDetail: (id: JobId) => Effect.Effect<JobDetail, SqlError.SqlError>
    readonly listJobs: (
      filter: ListFilter
    ) => Effect.Effect<ReadonlyArray<JobView>, ValidationError | SqlError.SqlError>
    readonly countByQueueState: Effect.Effect<ReadonlyArray<QueueStateCount>, SqlError.SqlError>
    /**
     * Per-queue statistics in one snapshot: open work by state, paused, oldest available job,
     * finalizations in total and recently. Costs the live work and the queue count, not the
     * stored history, unless `exact` asks for stored terminal counts too.
     */
    readonly queueStats: (
      options?: QueueStatsOptions
    ) => Effect.Effect<QueueStatsReport, ValidationError | SqlError.SqlError>
    /** Per-queue series of the leader's samples (sparklines). */
    readonly queueHistory: (
      options?: QueueHistoryOptions
    ) => Effect.Effect<QueueHistoryReport, ValidationError | SqlError.SqlError>
    /**
     * The leader's sample of per-queue figures (migration 0031); the sample's time, or `null`
     * when skipped (the last one is younger than `minIntervalMs`).
     */
    readonly sampleQueueStats: (
      params: SampleParams
    ) => Effect.Effect<Date | null, ReadCommittedRequired | SqlError.SqlError>
    /** Records a ring's prune state when it differs from the stored one; whether it changed. */
    readonly recordPruneState: (
      ring: "queue" | "history",
      state: PruneState
    ) => Effect.Effect<boolean, ReadCommittedRequired | SqlError.SqlError>
    /** Cancels a job that is not terminal: unclaimed, deferred or running (its attempt closes as cancelled). */
    readonly cancelJob: (
      id: JobId,
      reason: string
    ) => Effect.Effect<JobView, JobNotFound | InvalidTransition | ReadCommittedRequired | SqlError.SqlError>
    /**
     * Cancels the live job holding a unique key (hex), if any; returns its id. A key held by a
     * terminal job (e.g. completed, still in history) cancels nothing.
     */
    readonly cancelByUniqueKey: (
      key: string,
      reason: string
    ) => Effect.Effect<Option.Option<JobId>, ReadCommittedRequired | SqlError.SqlError>
    /** Makes a failed or cancelled job available again (attempt 0, run lease unchanged). */
    readonly retryJob: (
      id: JobId
    ) => Effect.Effect<
      JobView,
      JobNotFound | InvalidTransition | UniqueConflict | ReadCommittedRequired | SqlError.SqlError
    >
    readonly pauseQueue: (queue: string) => Effect.Effect<void, ValidationError | SqlError.SqlError>
    readonly resumeQueue: (queue: string) => Effect.Effect<void, ValidationError | SqlError.SqlError>
    readonly status: Effect.Effect<StorageStatus, SqlError.SqlError>
    /** Per-queue settings (DLQ routing and retention); only the fields given change. */
    readonly configureQueue: (
      queue: string,
      settings: QueueSettings
    ) => Effect.Effect<void, ValidationError | SqlError.SqlError>
    /** Whether queues without their own setting dead-letter failed jobs (default false). */
    readonly setDlqDefault: (enabled: boolean) => Effect.Effect<void, SqlError.SqlError>
    /**
     * Whether inserts skip their queue's wake-up while no worker waits for one (migration 0051,
     * docs/adr/0038-wake-ups-on-demand.md): on in a new install, off in an upgraded one until it is
     * turned on, once every worker runs a build that says when it waits (workers of earlier builds
     * would find such jobs only at their idle poll).
     */
    readonly wakeOnDemand: Effect.Effect<boolean, SqlError.SqlError>
    readonly setWakeOnDemand: (enabled: boolean) => Effect.Effect<void, SqlError.SqlError>
    readonly listDlq: (
      filter: DlqFilter
    ) => Effect.Effect<ReadonlyArray<DlqEntry>, ValidationError | SqlError.SqlError>
    readonly getDlq: (id: JobId) => Effect.Effect<DlqEntry, JobNotFound | SqlError.SqlError>
    /**
     * Moves a DLQ entry back to work: a new ready (or scheduled) representation of the same job
     * id, attempt 0, run lease unchanged, errors kept. A unique key held by another job ⇒
     * `UniqueConflict` and nothing changes.
     */
    readonly retryFromDlq: (
      id: JobId,
      overrides?: DlqRetryOverrides
    ) => Effect.Effect<
      JobView,
      JobNotFound | UniqueConflict | ValidationError | ReadCommittedRequired | SqlError.SqlError
    >
    readonly purgeDlq: (id: JobId) => Effect.Effect<void, JobNotFound | SqlError.SqlError>
    /**
     * Retries every entry matching the filter; an empty filter needs `all: true`. Returns how many.
     * In batches of 500, each its own transaction (inside the caller's transaction: all in it); an
     * entry whose unique key another job holds stays in the DLQ (migration 0027).
     */
    readonly retryDlqBulk: (
      filter: DlqFilter,
      options?: { readonly all?: boolean | undefined } & BulkProgress
    ) => Effect.Effect<number, UnsafeBulkFilter | ValidationError | ReadCommittedRequired | SqlError.SqlError>
    /**
     * Purges every entry matching the filter; an empty filter needs `all: true`. Returns how many.
     * In batches of 500, each its own transaction (migration 0027).
     */
    readonly purgeDlqBulk: (
      filter: DlqFilter,
      options?: { readonly all?: boolean | undefined } & BulkProgress
    ) => Effect.Effect<number, UnsafeBulkFilter | ValidationError | ReadCommittedRequired | SqlError.SqlError>
    /** Deletes up to `batch` entries older than their queue's retention (else `defaultRetentionMs`). */
    readonly cleanupDlq: (
      defaultRetentionMs: number,
      batch: number
    ) => Effect.Effect<number, ReadCommittedRequired | SqlError.SqlError>
    /**
     * Cancels every job of the queue that is not running yet (available, parked, scheduled,
     * retryable) and existed when the call started. In batches of 500, each its own transaction
     * (inside the caller's transaction: all in it), with no lane locked between batches: not
     * atomic, a claim may take a job between two batches (migration 0027).
     */
    readonly drainQueue: (
      queue: string,
      reason: string,
      progress?: BulkProgress
    ) => Effect.Effect<number, ValidationError | ReadCommittedRequired | SqlError.SqlError>
  }
>()("@awa/storage/QueueStorage") {}
