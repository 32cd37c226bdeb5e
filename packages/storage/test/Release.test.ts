/**
 * The `Release` outcome (migration 0018): what the worker records for an attempt cut off by its
 * own shutdown. Runnable again at once, the attempt not counted, the error recorded, guarded by
 * (job_id, run_lease) like every other outcome. The same suite runs on Postgres and the Sim.
 */
import { TestDatabase } from "@awa/testing"
import { assert, describe, layer, type Vitest } from "@effect/vitest"
import { Effect, Layer } from "effect"
import { layer as pgLayer } from "../src/PgQueueStorage.ts"
import { type ClaimedJob, QueueStorage } from "../src/QueueStorage.ts"
import * as SimQueueStorage from "../src/SimQueueStorage.ts"
import { claimOf, fresh } from "./pgFixtures.ts"

const release = { _tag: "Release", delayMs: 0, error: "interrupted: worker shutting down" } as const

const token = (c: ClaimedJob) => ({ jobId: c.jobId, runLease: c.runLease })

const suite = (it: Vitest.MethodsNonLive<QueueStorage>) => {
  it.effect(
    "a released attempt on the job's last attempt is retryable at once, not counted, its error kept",
    () =>
      Effect.gen(function* () {
        const storage = yield* QueueStorage
        const queue = fresh("release")
        const [job] = yield* storage.enqueueMany([{ kind: "k", queue, args: {}, maxAttempts: 1 }])
        const [first] = yield* storage.claim(claimOf(queue, 1))
        assert.strictEqual(first!.attempt, 1)
        const [result] = yield* storage.finalizeMany([{ ...token(first!), outcome: release }])
        assert.deepStrictEqual(result, { _tag: "Applied", state: "retryable" })
        const view = yield* storage.getJob(job!.id)
        assert.deepStrictEqual(
          [view.state, view.attempt, view.errors.map((e) => [e.error, e.attempt, e.terminal])],
          ["retryable", 0, [["interrupted: worker shutting down", 1, undefined]]]
        )
        yield* storage.promoteDue(100)
        const [second] = yield* storage.claim(claimOf(queue, 1))
        assert.deepStrictEqual([second!.jobId, second!.attempt, second!.runLease], [job!.id, 1, 2n])
        // a release is not a failure: the attempt that follows completes the job normally
        yield* storage.finalizeMany([{ ...token(second!), outcome: { _tag: "Complete" } }])
        assert.strictEqual((yield* storage.getJob(job!.id)).state, "completed")
      })
  )

  it.effect("a release of an attempt already closed is stale and changes nothing", () =>
    Effect.gen(function* () {
      const storage = yield* QueueStorage
      const queue = fresh("release-stale")
      const [job] = yield* storage.enqueueMany([{ kind: "k", queue, args: {}, maxAttempts: 3 }])
      const [claimed] = yield* storage.claim(claimOf(queue, 1))
      yield* storage.finalizeMany([{ ...token(claimed!), outcome: { _tag: "Complete" } }])
      const [late] = yield* storage.finalizeMany([{ ...token(claimed!), outcome: release }])
      assert.deepStrictEqual(late, { _tag: "Stale" })
      const view = yield* storage.getJob(job!.id)
      assert.deepStrictEqual([view.state, view.attempt, view.errors.length], ["completed", 1, 0])
    })
  )
}

describe("Release outcome", () => {
  layer(pgLayer().pipe(Layer.provideMerge(TestDatabase.layer())), {
    excludeTestServices: true,
    timeout: "60 seconds"
  })("on Postgres", suite)
  layer(SimQueueStorage.layer)("on the simulation", suite)
})
