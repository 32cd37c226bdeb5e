/**
 * Waiting for the outside world: a payment webhook. Used by docs/callbacks.md and run by
 * test/docs-examples.callbacks.test.ts (on the simulation layer, inside `it.effect`).
 */
import { Awa, AwaClient, Callbacks, Handler, Job } from "@awa/effect"
import { Effect, Layer, Schema } from "effect"
import { TestClock } from "effect/testing"

const Charge = Job.define({
  kind: "charge",
  args: Schema.Struct({ order: Schema.String, cents: Schema.Number }),
  queue: "payments"
})

/** Stands in for the payment provider: what we asked it to charge, and where to call back. */
export const provider: Array<{ readonly order: string; readonly callbackId: string }> = []

const charge = Handler.handler(Charge, ({ order }, ctx) =>
  Effect.gen(function* () {
    // 1. register first, so a webhook that arrives at once finds its callback
    const token = yield* ctx.registerCallback({
      timeout: "1 hour",
      filter: "payload.type == 'charge.final'",
      onFail: "payload.status == 'declined'",
      onComplete: "payload.status == 'paid'"
    })
    // 2. send the id out (here: the provider's API call, with the id as its reference)
    provider.push({ order, callbackId: token.id })
    // 3. park: the worker's permit is free until the webhook (or the timeout) comes
    return Job.JobResult.waitForCallback(token)
  })
)

/** The webhook endpoint's work: resolve by the callback's CEL expressions. */
export const webhook = (callbackId: string, payload: unknown) =>
  Effect.flatMap(Effect.service(Callbacks.Callbacks), (callbacks) =>
    callbacks.resolveCallback(callbackId, payload)
  )

const settle = Effect.gen(function* () {
  for (let i = 0; i < 20; i++) {
    yield* TestClock.adjust("100 millis")
    yield* Effect.yieldNow
  }
})

/** Two orders: one paid (after a progress event the filter ignores), one declined. */
export const paymentFlow = Effect.gen(function* () {
  const awa = yield* AwaClient.AwaClient
  const paid = yield* awa.insert(Charge, { order: "A-1", cents: 1200 })
  const declined = yield* awa.insert(Charge, { order: "A-2", cents: 900 })
  yield* settle
  const [a, b] = provider
  const ignored = yield* webhook(a!.callbackId, { type: "charge.pending" })
  yield* webhook(a!.callbackId, { type: "charge.final", status: "paid" })
  yield* webhook(b!.callbackId, { type: "charge.final", status: "declined" })
  return {
    ignored: ignored._tag,
    paid: (yield* awa.storage.getJob(paid.id)).state,
    declined: (yield* awa.storage.getJob(declined.id)).state
  }
}).pipe(
  Effect.provide(
    Awa.worker({ queues: { payments: { pollInterval: "100 millis" } }, handlers: [charge] }).pipe(
      Layer.provideMerge(Awa.layerSim())
    )
  )
)
