/**
 * `KeyGrants` on the simulation layer: the same observable behaviour as Postgres (migration 0033)
 * over the in-memory store of the `SimQueueStorage` it is built on. One fiber runs at a time, so
 * no claim is ever contended (`KeyLockContended` never happens here) and a change of limit needs
 * no lock to wait out claimers: `lower` marks the policy draining and verifies at once, then
 * every `verifyPollMs` of (test) clock time until its timeout.
 */
import { checkQueueName, ValidationError } from "@awa/core"
import { Clock, Effect, Layer } from "effect"
import { checkFleetRate } from "./FlowStorage.ts"
import {
  type KeyedClaim,
  type KeyedClaimParams,
  type KeyGrantStats,
  KeyGrants,
  type KeyPolicyChange,
  KeyPolicyNotFound,
  type KeyPolicyState,
  policyLimits,
  StaleKeyPolicyEpoch
} from "./KeyGrants.ts"
import { checkLimit, checkPolicyId } from "./PgKeyGrants.ts"
import { type ClaimedJob, QueueStorage } from "./QueueStorage.ts"
import { keyHooksOf } from "./SimQueueStorage.ts"
import * as SimRate from "./SimRate.ts"
import { checkInteger, maxClaimBatch } from "./StorageChecks.ts"

const verifyPollMs = 50

interface Policy {
  maxInFlight: number
  state: KeyPolicyState
  target: number | null
  epoch: bigint
}

export const make = Effect.gen(function* () {
  const storage = yield* QueueStorage
  const hooks = keyHooksOf(storage)
  if (hooks === undefined) return yield* Effect.die(new Error("SimKeyGrants needs SimQueueStorage"))
  const rateState = SimRate.stateOf(storage)
  const policies = new Map<string, Policy>()

  const view = (id: string, p: Policy) => ({
    id,
    maxInFlight: p.maxInFlight,
    state: p.state,
    target: p.target,
    epoch: p.epoch
  })

  const find = (id: string) =>
    Effect.flatMap(checkPolicyId(id), () => {
      const p = policies.get(id)
      return p === undefined ? Effect.fail(new KeyPolicyNotFound({ id })) : Effect.succeed(p)
    })

  const openOf = (policy: string) => {
    const perKey = new Map<string, number>()
    for (const g of hooks.grants()) if (g.policy === policy) perKey.set(g.key, (perKey.get(g.key) ?? 0) + 1)
    return perKey
  }

  const create = (policy: { readonly id: string; readonly maxInFlight: number }) =>
    Effect.gen(function* () {
      yield* checkPolicyId(policy.id)
      yield* checkLimit("maxInFlight", policy.maxInFlight)
      let p = policies.get(policy.id)
      if (p === undefined) {
        p = { maxInFlight: policy.maxInFlight, state: "active", target: null, epoch: 0n }
        policies.set(policy.id, p)
      } else if (p.maxInFlight !== policy.maxInFlight && p.state !== "draining") {
        return yield* new ValidationError({
          field: "maxInFlight",
          reason: `policy "${policy.id}" exists with maxInFlight ${p.maxInFlight}: change it with lower`
        })
      }
      return view(policy.id, p)
    })

  const show = (id: string) => Effect.map(find(id), (p) => view(id, p))

  const activate = (id: string, epoch: bigint, target: number) =>
    Effect.flatMap(find(id), (p): Effect.Effect<KeyPolicyChange, StaleKeyPolicyEpoch> => {
      if (p.epoch !== epoch || p.state !== "draining" || p.target !== target) {
        return Effect.fail(new StaleKeyPolicyEpoch({ id, epoch, target }))
      }
      if (Math.max(0, ...openOf(id).values()) > target) return Effect.succeed({ epoch, state: "draining" })
      p.state = "active"
      p.maxInFlight = target
      p.target = null
      return Effect.succeed({ epoch, state: "active" })
    })

  const lower = (id: string, target: number, opts?: { readonly verifyTimeoutMs?: number | undefined }) =>
    Effect.gen(function* () {
      const p = yield* find(id)
      yield* checkLimit("target", target)
      const timeoutMs = opts?.verifyTimeoutMs ?? policyLimits.defaultVerifyTimeoutMs
      yield* checkInteger("verifyTimeoutMs", timeoutMs, 0, policyLimits.maxVerifyTimeoutMs)
      p.state = "draining"
      p.target = target
      p.epoch += 1n
      const epoch = p.epoch
      const deadline = (yield* Clock.currentTimeMillis) + timeoutMs
      for (;;) {
        const change = yield* activate(id, epoch, target)
        if (change.state === "active" || (yield* Clock.currentTimeMillis) >= deadline) return change
        yield* Effect.sleep(verifyPollMs)
      }
    })

  const resume = (id: string, epoch: bigint, target: number) =>
    Effect.andThen(checkLimit("target", target), activate(id, epoch, target))

  const cancelChange = (id: string, epoch: bigint, target: number) =>
    Effect.gen(function* () {
      yield* checkLimit("target", target)
      const p = yield* find(id)
      if (p.epoch !== epoch || p.state !== "draining" || p.target !== target) {
        return yield* new StaleKeyPolicyEpoch({ id, epoch, target })
      }
      p.state = "active"
      p.target = null
      p.epoch += 1n
      return view(id, p)
    })

  const forceDisable = (id: string) =>
    Effect.map(find(id), (p) => {
      p.state = "disabled"
      p.target = null
      p.epoch += 1n
      return view(id, p)
    })

  const keyedClaim = (params: KeyedClaimParams, max: number, p: Policy, now: number) => {
    const open = openOf(params.policy)
    let gated = false
    const jobs = hooks.claimPrefix(
      { ...params, max },
      params.policy,
      (key) => {
        if (key === undefined || p.state === "disabled") return true
        const held = open.get(key) ?? 0
        if (p.state === "draining" || held >= p.maxInFlight) {
          gated = true
          return false
        }
        open.set(key, held + 1)
        return true
      },
      now
    )
    return { jobs, gated }
  }

  const claim = (params: KeyedClaimParams) =>
    Effect.gen(function* () {
      yield* checkQueueName(params.queue)
      yield* checkInteger("max", params.max, 0, maxClaimBatch)
      if (params.rate !== undefined) yield* checkFleetRate(params.rate)
      const p = yield* find(params.policy)
      const now = yield* Clock.currentTimeMillis
      if (params.rate === undefined) {
        const { jobs, gated } = keyedClaim(params, params.max, p, now)
        return claimed(jobs, gated, undefined)
      }
      // claim_keyed_rated (0045): GCRA on the simulation's clock, the budget shared with the
      // plain rated claim (SimRate); the keyed claim takes no yield, but a plain rated claim
      // holding the lock may, so this takes the lock too
      const rate = params.rate
      return yield* Effect.sync(() => {
        const a = SimRate.allowance(rate, rateState.tats.get(params.queue), now / 1000)
        if (a.tokens <= 0) return { _tag: "Throttled", nextTokenAt: new Date(a.nextAt * 1000) } as KeyedClaim
        const { jobs, gated } = keyedClaim(params, Math.min(params.max, a.tokens), p, now)
        if (jobs.length > 0) rateState.tats.set(params.queue, a.base + jobs.length * a.period)
        const cut = jobs.length === a.tokens && a.tokens < params.max
        return claimed(jobs, gated, cut ? new Date(SimRate.nextTokenAfter(a, jobs.length) * 1000) : undefined)
      }).pipe(rateState.lock.withPermits(1))
    })

  const claimed = (
    jobs: ReadonlyArray<ClaimedJob>,
    gated: boolean,
    nextTokenAt: Date | undefined
  ): KeyedClaim =>
    jobs.length > 0
      ? { _tag: "Claimed", jobs, blocked: gated ? "gated" : undefined, nextTokenAt }
      : gated
        ? { _tag: "KeyGated" }
        : { _tag: "Idle" }

  const openGrants = (policy: string, key: string) => Effect.sync(() => openOf(policy).get(key) ?? 0)

  const stats = Effect.sync(() =>
    [...policies.entries()]
      .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))
      .map(([id, p]): KeyGrantStats => {
        const perKey = openOf(id)
        let oldest: number | undefined
        for (const g of hooks.grants())
          if (g.policy === id && (oldest === undefined || g.at < oldest)) oldest = g.at
        return {
          policy: id,
          state: p.state,
          openGrants: [...perKey.values()].reduce((a, b) => a + b, 0),
          keysAtLimit: [...perKey.values()].filter((n) => n >= p.maxInFlight).length,
          oldestOpenGrantAt: oldest === undefined ? null : new Date(oldest)
        }
      })
  )

  return KeyGrants.of({
    create,
    show,
    lower,
    resume,
    cancelChange,
    forceDisable,
    claim,
    openGrants,
    stats,
    notifyClosed: () => Effect.void,
    notifyGated: () => Effect.void
  })
})

/** `KeyGrants` over the `SimQueueStorage` it is given. */
export const layer: Layer.Layer<KeyGrants, never, QueueStorage> = Layer.effect(KeyGrants, make)
