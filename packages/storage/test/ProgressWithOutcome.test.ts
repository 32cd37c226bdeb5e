/**
 * Progress written with the outcome (migration 0022) and handed back by the next claim, on both
 * storage layers with the same assertions.
 */
import { randomUUID } from "node:crypto"
import { ValidationError } from "@awa/core"
import { TestDatabase } from "@awa/testing"
import type { Vitest } from "@effect/vitest"
import { assert, describe, layer } from "@effect/vitest"
import { Effect, Layer } from "effect"
import { TestClock } from "effect/testing"
import { layer as pgLayer } from "../src/PgQueueStorage.ts"
import { type FinalizeItem, type Outcome, QueueStorage } from "../src/QueueStorage.ts"
import * as SimQueueStorage from "../src/SimQueueStorage.ts"

const claimOf = (queue: string) => ({ queue, max: 1, deadlineMs: 0, agingIntervalMs: 0 })

/** Enqueues one job on a fresh queue and claims it. */
const claimNew = Effect.gen(function* () {
  const storage = yield* QueueStorage
  const queue = `progress-${randomUUID().slice(0, 8)}`
  yield* storage.enqueueMany([{ kind: "p", queue, args: {} }])
  const [claimed] = yield* storage.claim(claimOf(queue))
  return { storage, queue, claimed: claimed! }
})

const item = (
  t: { jobId: bigint; runLease: bigint },
  outcome: Outcome,
  progress?: Record<string, unknown>
): FinalizeItem =>
  progress === undefined
    ? { jobId: t.jobId, runLease: t.runLease, outcome }
    : { jobId: t.jobId, runLease: t.runLease, outcome, progress }

const scenarios = (it: Vitest.MethodsNonLive<QueueStorage>, advance: (ms: number) => Effect.Effect<void>) => {
  it.effect("a retry's progress is kept and handed to the next claim; completion clears it", () =>
    Effect.gen(function* () {
      const { storage, queue, claimed } = yield* claimNew
      assert.strictEqual(claimed.progress, null)
      const checkpoint = { percent: 40, metadata: { cursor: 7 } }
      const [result] = yield* storage.finalizeMany([
        item(claimed, { _tag: "Retry", delayMs: 0, error: "x" }, checkpoint)
      ])
      assert.deepStrictEqual(result, { _tag: "Applied", state: "retryable" })
      assert.deepStrictEqual((yield* storage.getJob(claimed.jobId)).progress, checkpoint)
      yield* advance(5)
      yield* storage.promoteDue(100)
      const [again] = yield* storage.claim(claimOf(queue))
      assert.deepStrictEqual([again!.jobId, again!.attempt, again!.progress], [claimed.jobId, 2, checkpoint])
      yield* storage.finalizeMany([item(again!, { _tag: "Complete" }, { percent: 100 })])
      assert.strictEqual((yield* storage.getJob(claimed.jobId)).progress, null)
    })
  )

  it.effect("the outcome's progress wins over the heartbeat's; without one the heartbeat's stays", () =>
    Effect.gen(function* () {
      const a = yield* claimNew
      yield* a.storage.heartbeatMany([
        { jobId: a.claimed.jobId, runLease: a.claimed.runLease, progress: { from: "heartbeat" } }
      ])
      yield* a.storage.finalizeMany([item(a.claimed, { _tag: "Fail", error: "no" }, { from: "outcome" })])
      assert.deepStrictEqual((yield* a.storage.getJob(a.claimed.jobId)).progress, { from: "outcome" })

      const b = yield* claimNew
      yield* b.storage.heartbeatMany([
        { jobId: b.claimed.jobId, runLease: b.claimed.runLease, progress: { from: "heartbeat" } }
      ])
      yield* b.storage.finalizeMany([item(b.claimed, { _tag: "Cancel", reason: "stop" })])
      assert.deepStrictEqual((yield* b.storage.getJob(b.claimed.jobId)).progress, { from: "heartbeat" })

      const c = yield* claimNew
      yield* c.storage.finalizeMany([item(c.claimed, { _tag: "Snooze", delayMs: 60_000 }, { n: 1 })])
      const view = yield* c.storage.getJob(c.claimed.jobId)
      assert.deepStrictEqual([view.state, view.progress], ["scheduled", { n: 1 }])
    })
  )

  it.effect("a stale outcome writes no progress; progress that is not an object is rejected", () =>
    Effect.gen(function* () {
      const { storage, claimed } = yield* claimNew
      yield* storage.finalizeMany([item(claimed, { _tag: "Cancel", reason: "first" }, { kept: true })])
      const [stale] = yield* storage.finalizeMany([
        item(claimed, { _tag: "Fail", error: "late" }, { kept: false })
      ])
      assert.deepStrictEqual(stale, { _tag: "Stale" })
      assert.deepStrictEqual((yield* storage.getJob(claimed.jobId)).progress, { kept: true })
      for (const bad of [[1], "text", 3]) {
        const error = yield* Effect.flip(
          storage.finalizeMany([
            {
              jobId: claimed.jobId,
              runLease: claimed.runLease,
              outcome: { _tag: "Complete" },
              progress: bad as never
            }
          ])
        )
        assert.instanceOf(error, ValidationError)
        assert.strictEqual((error as ValidationError).field, "items[0].progress")
      }
    })
  )
}

describe("progress with the outcome on Postgres", () => {
  layer(pgLayer().pipe(Layer.provideMerge(TestDatabase.layer())), {
    excludeTestServices: true,
    timeout: "60 seconds"
  })("PgQueueStorage", (it) => {
    scenarios(it, (ms) => Effect.sleep(ms))
  })
})

describe("progress with the outcome on the simulation", () => {
  layer(SimQueueStorage.layer)("SimQueueStorage", (it) => {
    scenarios(it, (ms) => TestClock.adjust(ms))
  })
})
