/**
 * Handlers: the Effect that processes one job kind. `R` comes from the application's own layers.
 */
import type {
  CallbackStale,
  InvalidCelExpression,
  Job,
  ProgressTooLarge,
  ReadCommittedRequired,
  ValidationError
} from "@awa/core"
import type { ErrorEntry } from "@awa/storage"
import type { Duration, Effect } from "effect"
import type { SqlError } from "effect/sql"
import type { JobProgress } from "./Progress.ts"

/** What a handler sees of its job and attempt. */
export interface JobContext {
  readonly job: {
    readonly id: bigint
    readonly kind: string
    readonly queue: string
    readonly attempt: number
    readonly maxAttempts: number
    readonly runLease: bigint
    readonly metadata: Readonly<Record<string, unknown>>
    readonly tags: ReadonlyArray<string>
    readonly errors: ReadonlyArray<ErrorEntry>
    /**
     * The checkpoint the previous attempt left (its last progress, kept by retry, snooze, failure
     * and rescue), `null` when there is none. Fixed for the attempt: `setProgress` and
     * `updateMetadata` change what this attempt leaves, not this.
     */
    readonly progress: JobProgress | null
  }
  /** Aborted when the attempt is interrupted (cancel, rescue, deadline, shutdown). */
  readonly signal: AbortSignal
  /**
   * Sets the attempt's progress: `percent` clamped to 0–100 (not finite ⇒ `ValidationError`),
   * `message` (≤ 1,000 characters) replaced or removed; metadata kept. Buffered: written with the
   * next heartbeat, `flushProgress`, or the attempt's outcome, whichever comes first.
   */
  readonly setProgress: (
    percent: number,
    message?: string
  ) => Effect.Effect<void, ValidationError | ProgressTooLarge>
  /**
   * Merges `patch` shallowly into the progress metadata (the checkpoint a retry resumes from).
   * Buffered like `setProgress`. Not an object ⇒ `ValidationError`; the whole progress over
   * `maxProgressBytes` ⇒ `ProgressTooLarge`, and nothing changes.
   */
  readonly updateMetadata: (
    patch: Readonly<Record<string, unknown>>
  ) => Effect.Effect<void, ValidationError | ProgressTooLarge>
  /**
   * Writes buffered progress now (guarded by the attempt's run lease: a no-op once the attempt is
   * closed, and when nothing changed since the last write).
   */
  readonly flushProgress: Effect.Effect<void, SqlError.SqlError>
  /**
   * Registers a callback for this attempt (capabilities.md §17) and returns its token: register
   * first, then send `token.id` out. Then either return `JobResult.waitForCallback(token)` (park:
   * the permit is freed) or call `waitForCallback(token)` (wait here, holding the permit). A newer
   * registration makes the older id stale. CEL expressions over `payload` steer
   * `resolveCallback`; one that does not parse is `InvalidCelExpression`. `CallbackStale` when the
   * attempt is no longer open.
   */
  readonly registerCallback: (
    options: RegisterCallbackOptions
  ) => Effect.Effect<
    Job.CallbackToken,
    InvalidCelExpression | ValidationError | CallbackStale | ReadCommittedRequired | SqlError.SqlError
  >
  /**
   * Waits in the handler for a resume of `token`'s callback and returns its payload; repeatable
   * with a new registration each time. Woken by notification (a 1 s poll is the fallback).
   * `CallbackStale` when the callback was completed, failed or superseded instead (the attempt is
   * then usually interrupted anyway).
   */
  readonly waitForCallback: (
    token: Job.CallbackToken
  ) => Effect.Effect<unknown, CallbackStale | ReadCommittedRequired | SqlError.SqlError>
  /**
   * The payload of the resume that handed this parked attempt back (`undefined` when the attempt
   * was not resumed from a park). Same run lease and attempt number as before the park.
   */
  readonly callbackResult: unknown
}

export interface RegisterCallbackOptions {
  /** How long the callback may stay unresolved: 1 s – 30 days. Heartbeats extend it. */
  readonly timeout: Duration.Input
  /** CEL (bool): a payload it rejects is ignored by `resolveCallback`. */
  readonly filter?: string | undefined
  /** CEL (bool): true ⇒ `resolveCallback` completes. */
  readonly onComplete?: string | undefined
  /** CEL (bool): true ⇒ `resolveCallback` fails the job (checked before `onComplete`). */
  readonly onFail?: string | undefined
  /** CEL (any): maps the payload before it is delivered. */
  readonly transform?: string | undefined
}

export interface Handler<R = never> {
  readonly definition: Job.JobDefinition<any, any>
  readonly run: (args: unknown, ctx: JobContext) => Effect.Effect<Job.JobResult | void, unknown, R>
}

/** Binds a handler to a job definition; `args` arrive decoded by the definition's Schema. */
export const handler = <A, I, E, R>(
  definition: Job.JobDefinition<A, I>,
  run: (args: A, ctx: JobContext) => Effect.Effect<Job.JobResult | void, E, R>
): Handler<R> => ({ definition, run: run as Handler<R>["run"] })
