/**
 * Key-execution grants (capabilities.md §23, tier 2; docs/adr/0029-key-execution-grants.md): at
 * most `maxInFlight` running attempts per concurrency key across the whole fleet, for the queues
 * bound to a key policy.
 *
 * **Model** A grant is the attempt's claim carrying the policy id and the key's digest; the
 * attempt's closure (complete, retry, snooze, fail, cancel, DLQ, rescue, release) closes it.
 * Nothing counts grants but the claim itself: no per-key counter exists, so the ring stays
 * append-only and a pinned MVCC horizon costs no dead tuples.
 *
 * **Claim** `claim` is the claim of a queue bound to a policy: per lane, the longest contiguous
 * prefix of the lane's window whose keys are all within the limit (an unkeyed job is always
 * admitted). A lane whose head is not admitted keeps its cursor; the next lane is probed. The
 * answer says why nothing was claimed: `Idle` (no work), `KeyGated` (work whose keys are at their
 * limit, or the policy is draining: wait for a closure), `KeyLockContended` (another claimer held
 * a lane or key lock: retry shortly). Gated and contended are busy, not idle.
 *
 * **Changing the limit** (the epoch protocol) `lower(id, target)` stops keyed admissions
 * (`draining`), bumps the epoch and waits, up to `verifyTimeoutMs`, for every key to be within the
 * target, then activates it; otherwise the policy stays draining and `resume(id, epoch, target)`
 * tries again later, `cancelChange(id, epoch, target)` goes back to the old limit. A call whose
 * epoch or target is not the policy's current change fails with `StaleKeyPolicyEpoch`.
 * `forceDisable` lifts the limit altogether (grants are still recorded); `lower` re-enables.
 */
import type { ReadCommittedRequired, ValidationError } from "@awa/core"
import { Context, type Effect, Schema } from "effect"
import type { SqlError } from "effect/sql"
import type { FleetRate } from "./FlowStorage.ts"
import type { ClaimedJob, ClaimParams } from "./QueueStorage.ts"

export type KeyPolicyState = "active" | "draining" | "disabled"

export interface KeyPolicy {
  readonly id: string
  /** Open grants allowed per key while `active`. */
  readonly maxInFlight: number
  readonly state: KeyPolicyState
  /** The limit being changed to while `draining`; `null` otherwise. */
  readonly target: number | null
  /** Bumped by every change of limit, cancel and disable. */
  readonly epoch: bigint
}

export interface KeyPolicyChange {
  readonly epoch: bigint
  /** `active`: the target is the limit now; `draining`: some key still holds more than the target. */
  readonly state: "active" | "draining"
}

export interface KeyedClaimParams extends ClaimParams {
  readonly policy: string
  /**
   * The queue's fleet-wide rate limit, if it has one (migration 0045): the claim takes at most the
   * tokens there are, from the same budget as the queue's plain rated claims.
   */
  readonly rate?: FleetRate | undefined
}

export type KeyedClaim =
  | {
      readonly _tag: "Claimed"
      readonly jobs: ReadonlyArray<ClaimedJob>
      /**
       * Why the call stopped short of its window, if it did: a key at its limit (or the policy
       * draining), or a key's lock another claimer held. Absent when it took all it found.
       */
      readonly blocked?: "gated" | "contended" | undefined
      /** Under a fleet rate: the tokens cut the claim short; the next one is due then. */
      readonly nextTokenAt?: Date | undefined
    }
  | { readonly _tag: "Idle" }
  /** Under a fleet rate: no token left; the next one is due at `nextTokenAt`. */
  | { readonly _tag: "Throttled"; readonly nextTokenAt: Date }
  | { readonly _tag: "KeyGated" }
  | { readonly _tag: "KeyLockContended" }

/** What the metrics sample: per policy, its state, open grants and the oldest open grant. */
export interface KeyGrantStats {
  readonly policy: string
  readonly state: KeyPolicyState
  readonly openGrants: number
  readonly keysAtLimit: number
  readonly oldestOpenGrantAt: Date | null
}

export const policyLimits = {
  idMaxLength: 200,
  minMaxInFlight: 1,
  maxMaxInFlight: 1_000_000,
  /** Longest wait of `lower` for the keys to come within the target (chosen). */
  maxVerifyTimeoutMs: 60_000,
  defaultVerifyTimeoutMs: 5_000
} as const

export class KeyPolicyNotFound extends Schema.TaggedError<KeyPolicyNotFound>()("KeyPolicyNotFound", {
  id: Schema.String
}) {
  override get message(): string {
    return `key policy "${this.id}" does not exist`
  }
}

/** The change named by (epoch, target) is not the policy's pending one any more. */
export class StaleKeyPolicyEpoch extends Schema.TaggedError<StaleKeyPolicyEpoch>()("StaleKeyPolicyEpoch", {
  id: Schema.String,
  epoch: Schema.BigInt,
  target: Schema.Number
}) {
  override get message(): string {
    return `key policy "${this.id}": epoch ${this.epoch} with target ${this.target} is not the pending change`
  }
}

type Fails = ValidationError | ReadCommittedRequired | SqlError.SqlError

export class KeyGrants extends Context.Service<
  KeyGrants,
  {
    /** Creates the policy; the same call again is a no-op, another `maxInFlight` a `ValidationError`. */
    readonly create: (policy: {
      readonly id: string
      readonly maxInFlight: number
    }) => Effect.Effect<KeyPolicy, Fails>
    readonly show: (id: string) => Effect.Effect<KeyPolicy, KeyPolicyNotFound | Fails>
    /**
     * Starts a change of limit (from any state) and waits up to `verifyTimeoutMs` (default 5 s,
     * at most 60 s) to activate it; `StaleKeyPolicyEpoch` when another change overtook it.
     */
    readonly lower: (
      id: string,
      target: number,
      options?: { readonly verifyTimeoutMs?: number | undefined }
    ) => Effect.Effect<KeyPolicyChange, KeyPolicyNotFound | StaleKeyPolicyEpoch | Fails>
    /** Activates the pending change if every key is within its target now. */
    readonly resume: (
      id: string,
      epoch: bigint,
      target: number
    ) => Effect.Effect<KeyPolicyChange, KeyPolicyNotFound | StaleKeyPolicyEpoch | Fails>
    /** Abandons the pending change: the old limit applies again (new epoch). */
    readonly cancelChange: (
      id: string,
      epoch: bigint,
      target: number
    ) => Effect.Effect<KeyPolicy, KeyPolicyNotFound | StaleKeyPolicyEpoch | Fails>
    /** Lifts the limit (state `disabled`, new epoch); `lower` sets one again. */
    readonly forceDisable: (id: string) => Effect.Effect<KeyPolicy, KeyPolicyNotFound | Fails>
    /** Claims from a queue bound to `params.policy` (see the module comment). */
    readonly claim: (params: KeyedClaimParams) => Effect.Effect<KeyedClaim, KeyPolicyNotFound | Fails>
    /** Open grants of one key (tests, diagnostics). */
    readonly openGrants: (policy: string, key: string) => Effect.Effect<number, Fails>
    /** Per policy: state, open grants, keys at their limit, oldest open grant. */
    readonly stats: Effect.Effect<ReadonlyArray<KeyGrantStats>, Fails>
    /**
     * Tells the claimers of every queue under these key policies that a closure of a keyed
     * attempt committed (the `Closed` signal, StorageSignals), so a gated claimer retries at once
     * instead of at its safety poll; a claimer whose last claim left nothing claimable behind
     * ignores it.
     */
    readonly notifyClosed: (policies: ReadonlyArray<string>) => Effect.Effect<void, Fails>
    /**
     * Tells every process that a claimer under this key policy stopped at a key at its limit and
     * waits for a closure (the `Gated` signal, StorageSignals): workers announce their closures of
     * the policy's keyed attempts only while such a claimer is about (ADR 0037). Returns once the
     * announcement has committed.
     */
    readonly notifyGated: (policy: string) => Effect.Effect<void, Fails>
  }
>()("@awa/storage/KeyGrants") {}
