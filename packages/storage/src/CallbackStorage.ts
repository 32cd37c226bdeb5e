/**
 * `CallbackStorage`: external callbacks of attempts (capabilities.md §17, storage-engine.md §5.8;
 * docs/adr/0030-callbacks.md). Two implementations with one contract
 * (`test/contract/CallbackStorageContract.ts`): Postgres (`PgCallbackStorage`, migration 0034) and
 * the simulation (built by `SimQueueStorage`, which owns the simulated jobs).
 *
 * **Guarantees**
 * - A callback belongs to one open attempt `(jobId, runLease)`. Registering again replaces the
 *   attempt's callback; the older id is stale from then on.
 * - At most one resolution per callback: complete, fail and retry close the attempt (through the
 *   same guarded finalization as a handler's outcome, so they race it and each other with exactly
 *   one winner); resume delivers a payload once. Every loser gets `CallbackStale`.
 * - Complete, fail and resume are accepted while the handler still runs (a callback can arrive
 *   before the handler parks); retry only from a parked attempt (`InvalidTransition`).
 * - A parked attempt keeps its run lease; a resume hands it back to a worker with that lease
 *   (`claimResumed`). It is not rescued as stale while its callback is pending, and its claim
 *   deadline no longer applies: its callback timeout bounds it (`rescueTimedOut`).
 * - Ids: `CallbackNotFound` when nothing is known of the id (malformed, never registered, or
 *   its attempt's records are reclaimed), `CallbackStale` when its attempt is known but the id is
 *   no longer current.
 */
import type {
  CallbackNotFound,
  CallbackStale,
  InvalidTransition,
  JobState,
  ReadCommittedRequired,
  ValidationError
} from "@awa/core"
import { Context, type Effect, type Option } from "effect"
import type { SqlError } from "effect/sql"
import type { AttemptToken, ClaimedJob, RescuedAttempt } from "./QueueStorage.ts"

export type CallbackId = string

/** CEL expressions over `payload`, evaluated by the resolver (the runtime), stored with the callback. */
export interface CallbackExpressions {
  readonly filter?: string | undefined
  readonly onComplete?: string | undefined
  readonly onFail?: string | undefined
  readonly transform?: string | undefined
}

export interface RegisterCallback {
  /** 1 s – 30 days, in ms. */
  readonly timeoutMs: number
  readonly expressions?: CallbackExpressions | undefined
}

/** What parking found. */
export type ParkResult =
  | { readonly _tag: "Parked" }
  /** A resume arrived first: parked all the same, handed back to a worker by `claimResumed`. */
  | { readonly _tag: "Resumed" }
  /** The attempt is closed (a callback completed it first, rescue, cancel) or re-registered. */
  | { readonly _tag: "Stale" }

/** What an in-handler wait finds. */
export type TakeResult =
  | { readonly _tag: "Pending" }
  | { readonly _tag: "Resumed"; readonly payload: unknown }
  | { readonly _tag: "Stale" }

export interface CallbackInfo extends AttemptToken {
  readonly callbackId: CallbackId
  readonly status: "pending" | "resumed"
  readonly expressions: CallbackExpressions
  /** Parked (the handler freed its permit). */
  readonly waiting: boolean
}

export type CallbackAction =
  | { readonly _tag: "Complete" }
  | { readonly _tag: "Fail"; readonly error: string }
  /** From a parked attempt only: the job runs again from attempt 0. */
  | { readonly _tag: "Retry" }
  | { readonly _tag: "Resume"; readonly payload: unknown }
  /** Extends the wait: the timeout restarts at `timeoutMs` (1 s – 30 days) from now. */
  | { readonly _tag: "Heartbeat"; readonly timeoutMs: number }

export interface CallbackResolution extends AttemptToken {
  /** The job's state after the action (`running` after a resume or heartbeat of a running wait). */
  readonly state: JobState
}

/** A parked attempt a resume reached, handed back with its run lease and the payload. */
export interface ResumedJob extends ClaimedJob {
  readonly callbackResult: unknown
}

export type ResolveError =
  | CallbackNotFound
  | CallbackStale
  | InvalidTransition
  | ValidationError
  | ReadCommittedRequired
  | SqlError.SqlError

export const timeoutMsRange = { min: 1_000, max: 30 * 86_400_000 } as const

export class CallbackStorage extends Context.Service<
  CallbackStorage,
  {
    /** Registers the attempt's callback; `None` when the attempt is no longer open. */
    readonly register: (
      token: AttemptToken,
      params: RegisterCallback
    ) => Effect.Effect<Option.Option<CallbackId>, ValidationError | ReadCommittedRequired | SqlError.SqlError>
    /** Parks the attempt (the handler returned `waitForCallback`). */
    readonly park: (
      token: AttemptToken,
      callbackId: CallbackId
    ) => Effect.Effect<ParkResult, ReadCommittedRequired | SqlError.SqlError>
    /** An in-handler wait's check; `Resumed` spends the callback. */
    readonly take: (
      token: AttemptToken,
      callbackId: CallbackId
    ) => Effect.Effect<TakeResult, ReadCommittedRequired | SqlError.SqlError>
    /** What a resolver needs before resolving (the CEL expressions). Reads only. */
    readonly info: (
      callbackId: CallbackId
    ) => Effect.Effect<
      CallbackInfo,
      CallbackNotFound | CallbackStale | ReadCommittedRequired | SqlError.SqlError
    >
    readonly resolve: (
      callbackId: CallbackId,
      action: CallbackAction
    ) => Effect.Effect<CallbackResolution, ResolveError>
    /** Withdraws the attempt's pending callback; false when there was none (or it is closed). */
    readonly cancel: (
      token: AttemptToken
    ) => Effect.Effect<boolean, ReadCommittedRequired | SqlError.SqlError>
    /** Parked attempts of `queue` that a resume reached, for a worker to run again. */
    readonly claimResumed: (
      queue: string,
      max: number
    ) => Effect.Effect<ReadonlyArray<ResumedJob>, ReadCommittedRequired | SqlError.SqlError>
    /**
     * Gives a resumed attempt taken back by `claimResumed` and never started back to the queue
     * as still resumed (a stopping worker): another worker's `claimResumed` takes it, with its
     * payload and the same run lease. False when it is closed (rescued, cancelled) or was not a
     * taken-back resumed attempt; nothing is written then.
     */
    readonly releaseResumed: (
      token: AttemptToken
    ) => Effect.Effect<boolean, ReadCommittedRequired | SqlError.SqlError>
    /** The pending callback of the job's open attempt, if any (operators act by job id). */
    readonly pendingOf: (jobId: bigint) => Effect.Effect<Option.Option<CallbackId>, SqlError.SqlError>
    /** Leader: rescues attempts whose pending callback timed out (reason `callback_timeout`). */
    readonly rescueTimedOut: (
      limit: number
    ) => Effect.Effect<ReadonlyArray<RescuedAttempt>, ReadCommittedRequired | SqlError.SqlError>
  }
>()("@awa/storage/CallbackStorage") {}
