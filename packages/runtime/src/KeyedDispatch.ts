/**
 * The dispatcher's side of per-key execution control (capabilities.md §23,
 * docs/adr/0029-key-execution-grants.md): the claim of a queue, keyed or not, as one function;
 * the wake-up of gated claimers after a closure; and tier 1, the per-process key limit.
 *
 * - **Claim** A queue with a `keyPolicy` claims through `KeyGrants.claim`. `KeyGated` and
 *   `KeyLockContended` are busy, not idle: the dispatcher does not back its poll off for them.
 *   Gated waits for a wake-up (a closure of a keyed attempt notifies its queue) or the poll
 *   interval as a safety net; contended retries after 2–20 ms (jittered), as does a claim that
 *   took some jobs but stopped short at a contended key.
 * - **Closure notifications** Each finalization of a keyed attempt that storage applied notes its
 *   queue's key policy (a grant is the policy's: a closure in one queue may admit the key in
 *   another queue of the same policy); once per burst (coalesced) this process's dispatchers of
 *   every queue under the policy hear of it at once, and those of every process through Postgres
 *   (StorageSignals `Closed`) while a claimer under the policy is known to wait for a grant;
 *   dispatchers whose last claim left nothing behind ignore it (Dispatcher, "Closure wake-ups").
 *   A claimer that stops at a key at its limit says so to every process (`Gated`, at most once a
 *   second per process and queue) and claims once more; for a few seconds after that, closures
 *   under its policy are announced (ADR 0037). Closures by rescue and by an operator's cancel
 *   notify in SQL (rescue, cancel_job: migration 0036) as a plain wake-up of their queue, at
 *   their commit.
 * - **Tier 1** `localKeyConcurrency.limit`: at most `limit` handlers per key run in this process
 *   (jobs beyond it wait in the process, holding their claims, in order per key). Approximate
 *   fleet-wide: up to `limit × processes`; nothing is stored.
 */
import { concurrencyKeyMetadata } from "@awa/core"
import { type ClaimedJob, type ClaimParams, FlowStorage, KeyGrants, QueueStorage } from "@awa/storage"
import { Clock, Effect, Metric, Option, Queue, Random } from "effect"

/** Claim outcomes of keyed queues that found nothing claimable, by queue and outcome. */
export const keyClaimsBusy = Metric.counter("awa.key.claims_busy", {
  description: "keyed claims that claimed nothing because of keys: outcome gated or contended, by queue",
  incremental: true
})

export interface ClaimBatch {
  readonly jobs: ReadonlyArray<ClaimedJob>
  /** Why nothing was claimed although there may be work: keys at their limit, or a busy lock. */
  readonly busy: "gated" | "contended" | undefined
  /** The claim stopped at a per-call cap, not for want of work: claim again at once. */
  readonly capped: boolean
  /**
   * A keyed claim that took some jobs but stopped short at a key (at its limit, or locked by
   * another claimer): more may be claimable once a grant closes or the lock is released.
   */
  readonly stoppedAtKey: "gated" | "contended" | undefined
  /** A fleet rate cut the claim short (or left it no token): the next token is due then (epoch ms). */
  readonly nextTokenAt?: number | undefined
}

/** A keyed claim takes at most this many keys per call (claim_keyed, migration 0036; 32 before)... */
export const keysPerClaim = 64
/** ...and at most this many jobs. */
export const jobsPerKeyedClaim = 64

/** A claim that took nothing, and why (undefined: the queue had nothing claimable). */
const nothing = (busy: ClaimBatch["busy"]): ClaimBatch => ({
  jobs: [],
  busy,
  capped: false,
  stoppedAtKey: undefined
})

/**
 * The claim of one queue: the plain claim, the keyed claim of its policy, the rated claim, or the
 * keyed claim within the rate's tokens.
 */
export const claimer = Effect.fnUntraced(function* (
  queue: string,
  keyPolicy: string | undefined,
  /** The fleet rate in force at each claim (read per call: hot overrides retune it); none: unrated. */
  fleetRate?: (() => FlowStorage.FleetRate) | undefined
) {
  const storage = yield* QueueStorage
  if (fleetRate !== undefined && keyPolicy === undefined) {
    const flow = yield* Effect.serviceOption(FlowStorage.FlowStorage)
    if (Option.isNone(flow))
      return yield* Effect.die(
        new Error(`queue ${queue} has fleetRateLimit but no FlowStorage layer is provided`)
      )
    return (params: ClaimParams) =>
      Effect.map(
        flow.value.claimRated({ ...params, rate: fleetRate() }),
        (c): ClaimBatch => ({
          jobs: c.jobs,
          busy: undefined,
          capped: false,
          stoppedAtKey: undefined,
          nextTokenAt: c.nextTokenAt?.getTime()
        })
      )
  }
  if (keyPolicy === undefined) {
    return (params: ClaimParams) =>
      Effect.map(
        storage.claim(params),
        (jobs): ClaimBatch => ({ jobs, busy: undefined, capped: false, stoppedAtKey: undefined })
      )
  }
  const grants = yield* Effect.serviceOption(KeyGrants)
  if (Option.isNone(grants)) {
    return yield* Effect.die(new Error(`queue ${queue} has keyPolicy but no KeyGrants layer is provided`))
  }
  const gated = keyClaimsBusy.pipe(Metric.withAttributes({ "awa.queue": queue, outcome: "gated" }))
  const contended = keyClaimsBusy.pipe(Metric.withAttributes({ "awa.queue": queue, outcome: "contended" }))
  // a fleet rate as well: the keyed claim within the queue's tokens (migration 0045)
  return (params: ClaimParams) =>
    Effect.flatMap(
      grants.value.claim(
        fleetRate === undefined
          ? { ...params, policy: keyPolicy }
          : { ...params, policy: keyPolicy, rate: fleetRate() }
      ),
      (c): Effect.Effect<ClaimBatch> => {
        switch (c._tag) {
          case "Claimed":
            return Effect.succeed({
              jobs: c.jobs,
              busy: undefined,
              // as many as a call takes, or as many keys (each job has at most one): maybe more
              capped:
                c.jobs.length < params.max &&
                (c.jobs.length >= jobsPerKeyedClaim || c.jobs.length >= keysPerClaim),
              stoppedAtKey: c.blocked,
              nextTokenAt: c.nextTokenAt?.getTime()
            })
          case "Idle":
            return Effect.succeed(nothing(undefined))
          case "Throttled":
            return Effect.succeed({ ...nothing(undefined), nextTokenAt: c.nextTokenAt.getTime() })
          case "KeyGated":
            return Effect.as(Metric.update(gated, 1), nothing("gated"))
          case "KeyLockContended":
            return Effect.as(Metric.update(contended, 1), nothing("contended"))
        }
      }
    )
})

/** Wait of a contended keyed claim before it retries: 2–20 ms, jittered. */
export const contendedBackoff = Effect.flatMap(Random.nextBetween(2, 20), (ms) =>
  Effect.sleep(Math.round(ms))
)

/** The job's concurrency key, if it has one. */
export const keyOf = (job: ClaimedJob): string | undefined => {
  const key = job.metadata[concurrencyKeyMetadata]
  return typeof key === "string" ? key : undefined
}

/**
 * How long after a `Gated` announcement a process announces its closures under that policy (ADR
 * 0037). A claimer that stays gated announces again every `gatedAnnounceEveryMs`, so the window
 * stays open while anyone waits; these leave room for a claim and a delivery between the two.
 */
export const gatedWindowMs = 3_000
export const gatedAnnounceEveryMs = 1_000

export interface ClosureNotifier {
  /** Notes a closure of a keyed attempt under key policy `policy` (applied by storage). */
  readonly closed: (policy: string) => void
  /** A claimer under `policy` somewhere (this process included) announced that it waits for a closure. */
  readonly gatedSeen: (policy: string) => Effect.Effect<void>
  /**
   * Sends the notes, one burst at a time, until interrupted: the dispatchers of each noted
   * policy's queues in this process hear of it at once (`local`), and every process through
   * Postgres while a `Gated` announcement of the policy is recent; otherwise no claimer waits for
   * it and nothing is sent.
   */
  readonly run: (local: (policy: string) => Effect.Effect<void>) => Effect.Effect<never>
}

/**
 * Coalesces closure announcements: whatever piles up while one is sent goes in the next. Before
 * ADR 0037 every burst was announced through Postgres (a transaction of its own per burst, and a
 * delivery to every process's listener), waited for or not: at 200 jobs/s a sixth of the keyed
 * path's Node CPU and a third of its pickup tail over the plain claim's.
 */
export const makeClosureNotifier = Effect.gen(function* () {
  const grants = yield* Effect.serviceOption(KeyGrants)
  const pending = new Set<string>()
  /** Per policy: until when (epoch ms) its closures are announced through Postgres. */
  const announceUntil = new Map<string, number>()
  const bell = yield* Queue.sliding<void>(1)
  const closed = (policy: string) => {
    pending.add(policy)
    Queue.offerUnsafe(bell, undefined)
  }
  const gatedSeen = (policy: string) =>
    Effect.map(Clock.currentTimeMillis, (now) => void announceUntil.set(policy, now + gatedWindowMs))
  const send = (local: (policy: string) => Effect.Effect<void>) =>
    Effect.gen(function* () {
      const policies = [...pending]
      pending.clear()
      if (policies.length === 0) return
      const now = yield* Clock.currentTimeMillis
      const waitedFor = policies.filter((p) => (announceUntil.get(p) ?? 0) > now)
      if (Option.isSome(grants) && waitedFor.length > 0)
        yield* grants.value
          .notifyClosed(waitedFor)
          .pipe(Effect.catchCause((cause) => Effect.logDebug("closure notification lost", cause)))
      yield* Effect.forEach(policies, local, { discard: true })
    })
  const run = (local: (policy: string) => Effect.Effect<void>) =>
    Effect.forever(Effect.andThen(Queue.take(bell), send(local)))
  return { closed, gatedSeen, run } satisfies ClosureNotifier
})

/**
 * A gated claimer's announcement (ADR 0037): `key-gated:<policy>`, at most one per
 * `gatedAnnounceEveryMs` per queue in this process (per queue, not per policy: each gated queue's
 * dispatcher then claims once more after its own announcement, so two queues under one policy in
 * one process announce twice a second, and each covers its own race). `announce` answers whether
 * it sent one now (then the claimer claims once more: a closure that committed before the
 * announcement reached the closer's process was not announced, and that claim sees it).
 */
export const makeGatedAnnouncer = Effect.gen(function* () {
  const grants = yield* Effect.serviceOption(KeyGrants)
  const lastAt = new Map<string, number>()
  const announce = (policy: string, queue: string): Effect.Effect<boolean> =>
    Option.isNone(grants)
      ? Effect.succeed(false)
      : Effect.gen(function* () {
          const now = yield* Clock.currentTimeMillis
          const last = lastAt.get(queue)
          if (last !== undefined && now - last < gatedAnnounceEveryMs) return false
          lastAt.set(queue, now)
          return yield* grants.value.notifyGated(policy).pipe(
            Effect.as(true),
            Effect.catchCause((cause) =>
              Effect.as(Effect.logDebug("gated announcement lost; waiting for the poll", cause), false)
            )
          )
        })
  return { announce }
})

/**
 * Tier 1: at most `limit` running attempts per key in this process. `admit` says whether a job
 * may start now (and counts it); `finish` uncounts it and returns a held job of the same key that
 * may start in its place.
 */
export const makeLocalKeyGate = (limit: number) => {
  const running = new Map<string, number>()
  const held = new Map<string, Array<unknown>>()
  let heldCount = 0
  return {
    /** Jobs waiting here for their key (they count as buffered). */
    held: () => heldCount,
    admit: <A>(key: string | undefined, item: A): boolean => {
      if (key === undefined) return true
      const n = running.get(key) ?? 0
      if (n < limit) {
        running.set(key, n + 1)
        return true
      }
      let waiting = held.get(key)
      if (waiting === undefined) {
        waiting = []
        held.set(key, waiting)
      }
      waiting.push(item)
      heldCount++
      return false
    },
    finish: <A>(key: string | undefined): A | undefined => {
      if (key === undefined) return undefined
      const waiting = held.get(key)
      if (waiting !== undefined && waiting.length > 0) {
        heldCount--
        const next = waiting.shift() as A
        if (waiting.length === 0) held.delete(key)
        return next // the slot passes to it: the key's count is unchanged
      }
      const n = (running.get(key) ?? 1) - 1
      if (n <= 0) running.delete(key)
      else running.set(key, n)
      return undefined
    },
    /** Every held job (shutdown gives them back). */
    drain: <A>(): Array<A> => {
      const out: Array<A> = []
      for (const waiting of held.values()) out.push(...(waiting as Array<A>))
      held.clear()
      heldCount = 0
      return out
    }
  }
}
