/**
 * What the leader's rotate-prune duty asks of storage: the worker's ring policy per call (unset
 * fields left to the storage layer), and a ledger trim only after a tick that pruned.
 */
import { Job } from "@awa/core"
import type { PruneOutcome, RotatePolicy } from "@awa/storage"
import { assert, describe, it } from "@effect/vitest"
import { Clock, Effect, Schema } from "effect"
import { TestClock } from "effect/testing"
import { handler } from "../src/Handler.ts"
import * as Leader from "../src/Leader.ts"
import { resolveConfig } from "../src/Worker.ts"
import { leaderStorage } from "./support.ts"

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
  const layer = leaderStorage(() => ({
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
  }))
  return { calls, layer }
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

describe("Leader: a new term's first ticks", () => {
  it.effect(
    "promotion, rescue and the queue ring run at once; history, stats samples and DLQ retention wait one interval",
    () =>
      Effect.gen(function* () {
        const calls: Array<{ readonly duty: string; readonly at: number }> = []
        const record = (duty: string) =>
          Effect.flatMap(Clock.currentTimeMillis, (at) => Effect.sync(() => calls.push({ duty, at })))
        const storage = leaderStorage((sim) => ({
          promoteDue: (limit) => Effect.andThen(record("promote"), sim.promoteDue(limit)),
          rescueDeadlines: (limit) => Effect.andThen(record("rescue"), sim.rescueDeadlines(limit)),
          rotateWhenDue: (policy) => Effect.andThen(record("rotate"), sim.rotateWhenDue(policy)),
          rotateHistory: (minAgeMs) => Effect.andThen(record("history"), sim.rotateHistory(minAgeMs)),
          sampleQueueStats: (p) => Effect.andThen(record("sample"), sim.sampleQueueStats(p)),
          cleanupDlq: (retentionMs, batch) =>
            Effect.andThen(record("dlq"), sim.cleanupDlq(retentionMs, batch))
        }))
        const config = yield* resolveConfig({
          queues: { ledger: {} },
          handlers,
          maintenance: {
            promoteInterval: "1 minute",
            rescueInterval: "1 minute",
            rotateInterval: "1 minute",
            historyInterval: "20 seconds",
            statsSampleInterval: "10 seconds",
            dlqCleanupInterval: "30 seconds"
          }
        })
        const start = yield* Clock.currentTimeMillis
        const firstAt = (duty: string) => calls.find((c) => c.duty === duty)?.at
        yield* Effect.scoped(
          Effect.gen(function* () {
            yield* Leader.duties(config.maintenance!)
            yield* TestClock.adjust("1 second")
            assert.deepStrictEqual(
              ["promote", "rescue", "rotate", "history", "sample", "dlq"].map(
                (d) => firstAt(d) === undefined
              ),
              [false, false, false, true, true, true],
              "at once: promote, rescue, rotate; not yet: history, sample, dlq"
            )
            yield* TestClock.adjust("35 seconds")
          })
        ).pipe(Effect.provide(storage))
        assert.deepStrictEqual(
          ["promote", "rescue", "rotate", "sample", "history", "dlq"].map((d) => firstAt(d)! - start),
          [0, 0, 0, 10_000, 20_000, 30_000]
        )
        // then every interval, as before
        assert.deepStrictEqual(
          calls.filter((c) => c.duty === "sample").map((c) => c.at - start),
          [10_000, 20_000, 30_000]
        )
      })
  )
})
