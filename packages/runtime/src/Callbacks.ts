/**
 * `Callbacks`: resolving external callbacks from outside the handler (capabilities.md §17) —
 * what a webhook endpoint, an operator or a serverless function calls with a callback id.
 *
 * **Guarantees**
 * - At most one resolution per callback (storage's per-attempt lock): of concurrent callers one
 *   wins, every other gets `CallbackStale`. Unknown or malformed ids are `CallbackNotFound`.
 * - `resolveCallback` applies the callback's CEL expressions (filter, onFail, onComplete,
 *   transform); an expression that fails to evaluate falls back to `defaultAction` and logs a
 *   warning. The direct actions (`completeExternal`, …) ignore the expressions.
 * - `completeExternal`, `failExternal` and `resumeExternal` are accepted while the handler still
 *   runs (the callback may arrive before it parks); `retryExternal` only from a parked attempt.
 */
import {
  CallbackNotFound,
  CallbackStale,
  type InvalidTransition,
  type ReadCommittedRequired,
  ValidationError
} from "@awa/core"
import {
  type AttemptToken,
  type CallbackAction,
  type CallbackId,
  type CallbackResolution,
  CallbackStorage
} from "@awa/storage"
import { Context, Duration, Effect, Layer } from "effect"
import type { SqlError } from "effect/sql"
import * as CallbackCel from "./CallbackCel.ts"

export type ResolveError =
  | CallbackNotFound
  | CallbackStale
  | InvalidTransition
  | ValidationError
  | ReadCommittedRequired
  | SqlError.SqlError

export type ResolveOutcome =
  | {
      readonly _tag: "Resolved"
      readonly action: "complete" | "fail"
      readonly resolution: CallbackResolution
    }
  /** The filter rejected the payload (or the default action is `ignore`): still pending. */
  | { readonly _tag: "Ignored" }

export class Callbacks extends Context.Service<
  Callbacks,
  {
    /** Completes the job. `runLease`, when given, must be the callback's attempt (else `CallbackStale`). */
    readonly completeExternal: (
      callbackId: CallbackId,
      payload?: unknown,
      options?: { readonly runLease?: bigint | undefined }
    ) => Effect.Effect<CallbackResolution, ResolveError>
    /** Fails the job terminally with `error` (DLQ when its queue routes there). */
    readonly failExternal: (
      callbackId: CallbackId,
      error: string
    ) => Effect.Effect<CallbackResolution, ResolveError>
    /** A parked job runs again from attempt 0 (`InvalidTransition` unless parked). */
    readonly retryExternal: (callbackId: CallbackId) => Effect.Effect<CallbackResolution, ResolveError>
    /** Delivers `payload` to the wait: the in-handler wait returns it, a parked job runs again with it. */
    readonly resumeExternal: (
      callbackId: CallbackId,
      payload: unknown
    ) => Effect.Effect<CallbackResolution, ResolveError>
    /** Extends the wait: the callback times out `timeout` from now (1 s – 30 days). */
    readonly heartbeatCallback: (
      callbackId: CallbackId,
      timeout: Duration.Input
    ) => Effect.Effect<CallbackResolution, ResolveError>
    /** Resolves by the callback's CEL expressions, else `defaultAction` (default `complete`). */
    readonly resolveCallback: (
      callbackId: CallbackId,
      payload: unknown,
      defaultAction?: CallbackCel.DefaultAction
    ) => Effect.Effect<ResolveOutcome, ResolveError>
    /**
     * Operators act by job id (CLI, admin API): the job's pending callback gets `action`.
     * `CallbackNotFound` (naming the job) when the job has no pending callback.
     */
    readonly resolveWaiting: (
      jobId: bigint,
      action: CallbackAction
    ) => Effect.Effect<CallbackResolution, ResolveError>
    /** Withdraws an attempt's pending callback (e.g. the id could not be sent out). */
    readonly cancelCallback: (
      jobId: bigint,
      runLease: bigint
    ) => Effect.Effect<boolean, ReadCommittedRequired | SqlError.SqlError>
  }
>()("@awa/runtime/Callbacks") {}

/** The run lease a callback id names (its second field), if it is well formed. */
const leaseOf = (callbackId: string): bigint | undefined => {
  const m = /^[0-9]{1,18}\.([0-9]{1,18})\.[0-9a-f]{32}$/.exec(callbackId)
  return m === null ? undefined : BigInt(m[1]!)
}

export const make = Effect.gen(function* () {
  const storage = yield* CallbackStorage

  const resolve = (callbackId: CallbackId, action: CallbackAction) => storage.resolve(callbackId, action)

  const completeExternal = (
    callbackId: CallbackId,
    _payload?: unknown,
    options?: { readonly runLease?: bigint | undefined }
  ) =>
    Effect.suspend(() => {
      if (options?.runLease !== undefined) {
        const lease = leaseOf(callbackId)
        if (lease === undefined) return Effect.fail(new CallbackNotFound({ callbackId }))
        if (lease !== options.runLease) return Effect.fail(new CallbackStale({ callbackId }))
      }
      return resolve(callbackId, { _tag: "Complete" })
    })

  const heartbeatCallback = (callbackId: CallbackId, timeout: Duration.Input) =>
    Effect.suspend(() => {
      const d = Duration.fromInput(timeout)
      if (d._tag === "None")
        return Effect.fail(new ValidationError({ field: "timeout", reason: "is not a duration" }))
      return resolve(callbackId, { _tag: "Heartbeat", timeoutMs: Math.round(Duration.toMillis(d.value)) })
    })

  const resolveCallback = (
    callbackId: CallbackId,
    payload: unknown,
    defaultAction: CallbackCel.DefaultAction = "complete"
  ) =>
    Effect.gen(function* () {
      const info = yield* storage.info(callbackId)
      const decision = CallbackCel.decide(info.expressions, payload, defaultAction)
      if (decision.warnings.length > 0)
        yield* Effect.logWarning(
          `callback ${callbackId}: CEL evaluation failed, default action ${defaultAction}: ${decision.warnings.join("; ")}`
        )
      if (decision.action === "ignore") return { _tag: "Ignored" } as const
      const resolution = yield* resolve(
        callbackId,
        decision.action === "complete"
          ? { _tag: "Complete" }
          : { _tag: "Fail", error: `failed by callback: ${JSON.stringify(decision.payload) ?? "null"}` }
      )
      return { _tag: "Resolved", action: decision.action, resolution } as const
    })

  return Callbacks.of({
    completeExternal,
    failExternal: (callbackId, error) => resolve(callbackId, { _tag: "Fail", error }),
    retryExternal: (callbackId) => resolve(callbackId, { _tag: "Retry" }),
    resumeExternal: (callbackId, payload) => resolve(callbackId, { _tag: "Resume", payload }),
    heartbeatCallback,
    resolveCallback,
    resolveWaiting: (jobId, action) =>
      Effect.flatMap(storage.pendingOf(jobId), (id) =>
        id._tag === "None"
          ? Effect.fail(new CallbackNotFound({ callbackId: `(job ${jobId} has no pending callback)` }))
          : resolve(id.value, action)
      ),
    cancelCallback: (jobId, runLease) => storage.cancel({ jobId, runLease } satisfies AttemptToken)
  })
})

export const layer: Layer.Layer<Callbacks, never, CallbackStorage> = Layer.effect(Callbacks, make)
