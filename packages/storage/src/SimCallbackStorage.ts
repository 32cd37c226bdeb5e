/**
 * `CallbackStorage` in memory, over the jobs of one `SimQueueStorage` instance (which builds it:
 * the attempts are its own). Same observable semantics as migration 0034, run by the same
 * contract suite; each call is one synchronous step, so "at most one resolution" holds trivially,
 * and the contract checks the outcome (one winner, the rest `CallbackStale`).
 *
 * Gotchas (besides SimQueueStorage's): ids are `<job>.<lease>.<32 hex>` from Effect's `Random`
 * (deterministic only under a seeded `Random`); a stale id stays `CallbackStale` while its job is
 * stored (Postgres: until its ring slot is reclaimed, then `CallbackNotFound`).
 */
import { Backoff, CallbackNotFound, CallbackStale, InvalidTransition, type JobState } from "@awa/core"
import { Clock, Effect, Option, Random } from "effect"
import {
  type CallbackAction,
  type CallbackExpressions,
  type CallbackId,
  type CallbackInfo,
  CallbackStorage,
  type ParkResult,
  type RegisterCallback,
  type ResumedJob,
  type TakeResult,
  timeoutMsRange
} from "./CallbackStorage.ts"
import type { AttemptToken, ClaimedJob, Outcome, RescuedAttempt } from "./QueueStorage.ts"
import { checkInteger } from "./StorageChecks.ts"

/** The callback state of one open attempt (Postgres: attempt_state's callback columns). */
export interface SimCallback {
  id: CallbackId | null
  timeoutAt: number
  expressions: CallbackExpressions
  state: "pending" | "resumed" | null
  /** Resume payload as JSON text. */
  resultJson: string | null
  /** Parked: the handler freed its permit. */
  waiting: boolean
  /** Set by the first park; the claim's deadline no longer applies. */
  parkedAt: number | null
}

/** What the simulation's job exposes to callbacks. */
export interface SimAttempt {
  readonly id: bigint
  readonly runLease: bigint
  readonly queue: string
  attempt: number
  heartbeatAt: number | null
  callback: SimCallback | null
}

/** The simulated queue storage's side of the bargain. */
export interface SimCallbackHost {
  /** The attempt, if it is open. */
  readonly open: (token: AttemptToken) => SimAttempt | undefined
  /** Whether the job exists with this run lease or a newer one (an id of it is stale, not unknown). */
  readonly known: (token: AttemptToken) => boolean
  /** Applies an outcome to an open attempt (the finalization path); returns the new state. */
  readonly close: (attempt: SimAttempt, outcome: Outcome, now: number, reason?: string) => JobState
  /** Open attempts, for the timeout sweep. */
  readonly openAttempts: () => Iterable<SimAttempt>
  /** The attempt as a worker receives it. */
  readonly claimed: (attempt: SimAttempt, now: number) => ClaimedJob
}

const idPattern = /^([0-9]{1,18})\.([0-9]{1,18})\.[0-9a-f]{32}$/

const tokenOf = (callbackId: string): AttemptToken | undefined => {
  const m = idPattern.exec(callbackId)
  return m === null ? undefined : { jobId: BigInt(m[1]!), runLease: BigInt(m[2]!) }
}

const stripExpressions = (e: CallbackExpressions | undefined): CallbackExpressions => {
  const out: Record<string, string> = {}
  for (const key of ["filter", "onComplete", "onFail", "transform"] as const) {
    const value = e?.[key]
    if (value !== undefined) out[key] = value
  }
  return out
}

export const make = (host: SimCallbackHost) => {
  const newId = (token: AttemptToken) =>
    Effect.map(Random.Random, (random) => {
      let hex = ""
      for (let i = 0; i < 4; i++)
        hex += Math.floor(random.nextDoubleUnsafe() * 2 ** 32)
          .toString(16)
          .padStart(8, "0")
      return `${token.jobId}.${token.runLease}.${hex}`
    })

  const register = (token: AttemptToken, params: RegisterCallback) =>
    Effect.gen(function* () {
      yield* checkInteger("timeout", params.timeoutMs, timeoutMsRange.min, timeoutMsRange.max)
      const id = yield* newId(token)
      const now = yield* Clock.currentTimeMillis
      return yield* Effect.sync(() => {
        const attempt = host.open(token)
        if (attempt === undefined) return Option.none<CallbackId>()
        attempt.heartbeatAt = now
        attempt.callback = {
          id,
          timeoutAt: now + params.timeoutMs,
          expressions: stripExpressions(params.expressions),
          state: "pending",
          resultJson: null,
          waiting: false,
          parkedAt: attempt.callback?.parkedAt ?? null
        }
        return Option.some(id)
      })
    })

  /** The open attempt whose current callback is `callbackId`. */
  const current = (token: AttemptToken, callbackId: CallbackId) => {
    const attempt = host.open(token)
    return attempt?.callback?.id === callbackId ? attempt : undefined
  }

  const park = (token: AttemptToken, callbackId: CallbackId) =>
    Effect.flatMap(Clock.currentTimeMillis, (now) =>
      Effect.sync((): ParkResult => {
        const attempt = current(token, callbackId)
        if (attempt === undefined) return { _tag: "Stale" }
        const callback = attempt.callback!
        callback.waiting = true
        callback.parkedAt ??= now
        return callback.state === "resumed" ? { _tag: "Resumed" } : { _tag: "Parked" }
      })
    )

  const take = (token: AttemptToken, callbackId: CallbackId) =>
    Effect.sync((): TakeResult => {
      const attempt = current(token, callbackId)
      if (attempt === undefined) return { _tag: "Stale" }
      const callback = attempt.callback!
      if (callback.state !== "resumed") return { _tag: "Pending" }
      const payload = callback.resultJson === null ? null : JSON.parse(callback.resultJson)
      callback.id = null
      callback.state = null
      callback.waiting = false
      return { _tag: "Resumed", payload }
    })

  /** The open attempt and its callback, or the error a resolver gets. */
  const lookup = (callbackId: CallbackId) => {
    const token = tokenOf(callbackId)
    if (token === undefined) return new CallbackNotFound({ callbackId })
    const attempt = current(token, callbackId)
    if (attempt === undefined || attempt.callback!.state === null)
      return host.known(token) ? new CallbackStale({ callbackId }) : new CallbackNotFound({ callbackId })
    return attempt
  }

  const info = (callbackId: CallbackId) =>
    Effect.suspend(() => {
      const found = lookup(callbackId)
      if (found instanceof CallbackNotFound || found instanceof CallbackStale) return Effect.fail(found)
      const callback = found.callback!
      return Effect.succeed({
        callbackId,
        jobId: found.id,
        runLease: found.runLease,
        status: callback.state as "pending" | "resumed",
        expressions: { ...callback.expressions },
        waiting: callback.waiting
      } satisfies CallbackInfo)
    })

  const resolve = (callbackId: CallbackId, action: CallbackAction) =>
    Effect.gen(function* () {
      if (action._tag === "Heartbeat")
        yield* checkInteger("timeout", action.timeoutMs, timeoutMsRange.min, timeoutMsRange.max)
      const now = yield* Clock.currentTimeMillis
      const found = lookup(callbackId)
      if (found instanceof CallbackNotFound || found instanceof CallbackStale) return yield* found
      const callback = found.callback!
      const token = { jobId: found.id, runLease: found.runLease }
      if (callback.state !== "pending" && !(action._tag === "Heartbeat" && callback.state === "resumed"))
        return yield* new CallbackStale({ callbackId })
      switch (action._tag) {
        case "Heartbeat":
          callback.timeoutAt = now + action.timeoutMs
          return { ...token, state: callback.waiting ? "waiting_external" : "running" } as const
        case "Resume":
          callback.state = "resumed"
          callback.resultJson = JSON.stringify(action.payload === undefined ? null : action.payload)
          found.heartbeatAt = now
          return { ...token, state: "running" } as const
        case "Retry": {
          if (!callback.waiting)
            return yield* new InvalidTransition({
              jobId: found.id,
              from: "running",
              action: "retry callback of"
            })
          const state = host.close(found, { _tag: "Release", delayMs: 0, error: "retried by callback" }, now)
          found.attempt = 0
          return { ...token, state }
        }
        case "Complete":
          return { ...token, state: host.close(found, { _tag: "Complete" }, now) }
        case "Fail":
          return { ...token, state: host.close(found, { _tag: "Fail", error: action.error }, now) }
      }
    })

  const cancel = (token: AttemptToken) =>
    Effect.flatMap(Clock.currentTimeMillis, (now) =>
      Effect.sync(() => {
        const attempt = host.open(token)
        if (attempt?.callback?.state !== "pending") return false
        attempt.callback = { ...attempt.callback, id: null, state: null, waiting: false, resultJson: null }
        attempt.heartbeatAt = now
        return true
      })
    )

  const claimResumed = (queue: string, max: number) =>
    Effect.flatMap(Clock.currentTimeMillis, (now) =>
      Effect.sync(() => {
        const out: Array<ResumedJob> = []
        for (const attempt of host.openAttempts()) {
          if (out.length >= max) break
          const callback = attempt.callback
          if (
            attempt.queue !== queue ||
            callback === null ||
            !callback.waiting ||
            callback.state !== "resumed"
          )
            continue
          const payload = callback.resultJson === null ? null : JSON.parse(callback.resultJson)
          attempt.callback = { ...callback, id: null, state: null, waiting: false }
          attempt.heartbeatAt = now
          out.push({ ...host.claimed(attempt, now), deadlineAt: null, callbackResult: payload })
        }
        return out as ReadonlyArray<ResumedJob>
      })
    )

  const releaseResumed = (token: AttemptToken) =>
    Effect.flatMap(Clock.currentTimeMillis, (now) =>
      Effect.sync(() => {
        const attempt = host.open(token)
        const callback = attempt?.callback ?? null
        // taken back by claimResumed: parked once, no longer waiting, no callback registered since
        if (
          attempt === undefined ||
          callback === null ||
          callback.parkedAt === null ||
          callback.waiting ||
          callback.state !== null ||
          callback.id !== null
        )
          return false
        attempt.callback = { ...callback, state: "resumed", waiting: true }
        attempt.heartbeatAt = now
        return true
      })
    )

  const rescueTimedOut = (limit: number) =>
    Effect.gen(function* () {
      const now = yield* Clock.currentTimeMillis
      const random = yield* Random.Random
      return yield* Effect.sync(() =>
        [...host.openAttempts()]
          .filter((a) => a.callback?.state === "pending" && a.callback.timeoutAt < now)
          .sort((a, b) => a.callback!.timeoutAt - b.callback!.timeoutAt || (a.id < b.id ? -1 : 1))
          .slice(0, Math.max(0, Math.floor(limit)))
          .map((a): RescuedAttempt => {
            const token = { jobId: a.id, runLease: a.runLease }
            const delayMs = Backoff.defaultBackoffMs(a.attempt, random.nextDoubleUnsafe())
            const state = host.close(
              a,
              { _tag: "Retry", delayMs, error: "callback timed out" },
              now,
              "callback_timeout"
            )
            return { ...token, reason: "callback_timeout", state, queue: "", kind: "" }
          })
      )
    })

  const pendingOf = (jobId: bigint) =>
    Effect.sync(() => {
      for (const attempt of host.openAttempts())
        if (attempt.id === jobId && attempt.callback?.state === "pending" && attempt.callback.id !== null)
          return Option.some(attempt.callback.id)
      return Option.none<CallbackId>()
    })

  return CallbackStorage.of({
    register,
    park,
    take,
    info,
    resolve,
    cancel,
    claimResumed,
    releaseResumed,
    pendingOf,
    rescueTimedOut
  })
}
