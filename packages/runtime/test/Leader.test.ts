/**
 * What the leader's rotate-prune duty asks of storage: the worker's ring policy per call (unset
 * fields left to the storage layer), and a ledger trim only after a tick that pruned.
 */
import { Job } from "@awa/core"
import {
  CronStorage,
  type PruneOutcome,
  QueueStorage,
  type RotatePolicy,
  SimQueueStorage
} from "@awa/storage"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Layer, Schema } from "effect"
import { TestClock } from "effect/testing"
import { handler } from "../src/Handler.ts"
import * as Leader from "../src/Leader.ts"
import { resolveConfig } from "../src/Worker.ts"

const Tick = Job.define({ kind: "tick", args: Schema.Struct({ n: Schema.Number }), queue: "ledger" })
const handlers = [handler(Tick, () => Effect.void)]

/** Simulated storage whose rotate/prune/trim calls are recorded; prune answers `prunes` in turn. */
const recording = (prunes: ReadonlyArray<PruneOutcome["_tag"]>) => {
  const calls: Array<
    | { readonly call: "rotate"; readonly policy: RotatePolicy }
    | { readonly call: "prune"; readonly carryAfterMs: number | undefined }
    | { readonly call: "trim" }
  > = []
  let next = 0
  const storage = Layer.effect(
    QueueStorage,
    Effect.map(SimQueueStorage.make, (sim) =>
      QueueStorage.of({
        ...sim,
        rotateWhenDue: (policy) =>
          Effect.sync(() => {
            calls.push({ call: "rotate", policy })
            return "Rotated" as const
          }),
        prune: (p) =>
          Effect.sync((): PruneOutcome => {
            calls.push({ call: "prune", carryAfterMs: p.carryAfterMs })
            const tag = prunes[next++] ?? "Noop"
            return tag === "Pruned" ? { _tag: "Pruned", generation: 1n, carried: 0 } : { _tag: "Noop" }
          }),
        trimLedgers: () =>
          Effect.sync(() => {
            calls.push({ call: "trim" })
            return { deleted: 0, more: false }
          })
      })
    )
  )
  return { calls, layer: Layer.provideMerge(CronStorage.layerSim, storage) }
}

/**
 * Runs the duties under the test clock for one second: the rotate-prune tick runs once (at once;
 * the next is due after `rotateInterval`), and every call it makes is recorded when this returns.
 */
const oneTick = (
  maintenance: Parameters<typeof resolveConfig>[0]["maintenance"],
  prunes: ReadonlyArray<PruneOutcome["_tag"]>
) =>
  Effect.gen(function* () {
    const config = yield* resolveConfig({ queues: { ledger: {} }, handlers, maintenance })
    const { calls, layer } = recording(prunes)
    yield* Effect.scoped(
      Effect.andThen(Leader.duties(config.maintenance!), TestClock.adjust("1 second"))
    ).pipe(Effect.provide(layer))
    return calls
  })

describe("Leader rotate-prune duty", () => {
  it.effect("passes the worker's ring policy per call and trims the ledgers after a prune", () =>
    Effect.gen(function* () {
      const calls = yield* oneTick(
        { rotateInterval: "1 minute", rotateMinRows: 7, rotateMaxAge: "3 seconds", pruneCarryAfter: 0 },
        ["Pruned", "Pruned", "Noop"]
      )
      assert.deepStrictEqual(calls, [
        { call: "rotate", policy: { minRows: 7, maxAgeMs: 3000 } },
        { call: "prune", carryAfterMs: 0 },
        { call: "prune", carryAfterMs: 0 },
        { call: "prune", carryAfterMs: 0 },
        { call: "trim" }
      ])
    })
  )

  it.effect(
    "leaves unset fields to the storage layer, and trims nothing after a tick that pruned nothing",
    () =>
      Effect.gen(function* () {
        const calls = yield* oneTick({ rotateInterval: "1 minute" }, ["Noop"])
        assert.deepStrictEqual(calls, [
          { call: "rotate", policy: { minRows: undefined, maxAgeMs: undefined } },
          { call: "prune", carryAfterMs: undefined }
        ])
      })
  )
})
