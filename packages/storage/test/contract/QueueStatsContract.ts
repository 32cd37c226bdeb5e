/**
 * `queueStats` (issue 18): the same observable statistics from every `QueueStorage` layer. Run by
 * `QueueStats.test.ts` on Postgres (real time) and on the simulation (`TestClock`).
 */
import { randomUUID } from "node:crypto"
import type { NewJob } from "@awa/core"
import type { Vitest } from "@effect/vitest"
import { assert } from "@effect/vitest"
import { Effect } from "effect"
import { type QueueStats, QueueStorage } from "../../src/QueueStorage.ts"

const freshQueue = (label: string) => `${label}-${randomUUID().slice(0, 8)}`
const job = (queue: string, extra: Partial<NewJob> = {}): NewJob => ({
  kind: "stats_job",
  queue,
  args: {},
  ...extra
})
const claimOf = (queue: string, max: number) => ({ queue, max, deadlineMs: 0, agingIntervalMs: 0 })

/** The counts of one queue, without the timestamps. */
const countsOf = (s: QueueStats | undefined) =>
  s === undefined
    ? undefined
    : {
        paused: s.paused,
        available: s.available,
        running: s.running,
        scheduled: s.scheduled,
        retryable: s.retryable,
        deadLettered: s.deadLettered,
        finalizedTotal: s.finalizedTotal,
        recent: s.recent,
        stored: s.stored
      }

export const suite = (it: Vitest.MethodsNonLive<QueueStorage>) => {
  it.effect(
    "counts every open state, finalizations in total and recently, paused and the oldest available job",
    () =>
      Effect.gen(function* () {
        const storage = yield* QueueStorage
        const q = freshQueue("stats")
        const far = new Date(Date.UTC(2100, 0, 1))
        yield* storage.enqueueMany([job(q), job(q), job(q), job(q, { runAt: far })])
        const [first, second] = yield* storage.claim(claimOf(q, 3))
        yield* storage.finalizeMany([
          { jobId: first!.jobId, runLease: first!.runLease, outcome: { _tag: "Complete" } },
          { jobId: second!.jobId, runLease: second!.runLease, outcome: { _tag: "Fail", error: "boom" } }
        ])
        yield* storage.enqueueMany([job(q), job(q)])
        const later = (yield* storage.enqueueMany([job(q)]))[0]!
        yield* storage.claim(claimOf(q, 1))
        yield* storage.pauseQueue(q)
        const fast = yield* storage.queueStats()
        const mine = fast.queues.find((x) => x.queue === q)
        assert.deepStrictEqual(countsOf(mine), {
          paused: true,
          available: 2,
          running: 2,
          scheduled: 1,
          retryable: 0,
          deadLettered: 0,
          finalizedTotal: { completed: 1, failed: 1, cancelled: 0 },
          recent: { completed: 1, failed: 1, cancelled: 0 },
          stored: null
        })
        assert.isFalse(fast.exact)
        assert.isTrue(fast.windowStart.getTime() <= fast.asOf.getTime() - 299_000)
        assert.isTrue(fast.staleness.length > 0)
        assert.isNotNull(mine!.oldestAvailableAt)
        assert.isTrue(mine!.oldestAvailableAt!.getTime() <= fast.asOf.getTime())
        const laterRunAt = (yield* storage.getJob(later.id)).runAt
        assert.isTrue(mine!.oldestAvailableAt!.getTime() <= laterRunAt.getTime())

        const exact = yield* storage.queueStats({ exact: true })
        assert.isTrue(exact.exact)
        assert.deepStrictEqual(exact.queues.find((x) => x.queue === q)?.stored, {
          completed: 1,
          failed: 1,
          cancelled: 0
        })
        // the open counts agree with the exact scan of every job
        const scanned = (yield* storage.countByQueueState).filter((x) => x.queue === q)
        const of = (state: string) => scanned.find((x) => x.state === state)?.count ?? 0
        assert.deepStrictEqual(
          [mine!.available, mine!.running, mine!.scheduled],
          [of("available"), of("running"), of("scheduled")]
        )
        yield* storage.cancelJob(later.id, "operator")
        const after = (yield* storage.queueStats()).queues.find((x) => x.queue === q)
        assert.deepStrictEqual(
          [after!.available, after!.finalizedTotal.cancelled, after!.recent.cancelled],
          [1, 1, 1]
        )
      })
  )

  it.effect(
    "a dead-lettered job counts in deadLettered, not as a failed finalization; retried jobs count again",
    () =>
      Effect.gen(function* () {
        const storage = yield* QueueStorage
        const q = freshQueue("stats-dlq")
        yield* storage.configureQueue(q, { dlq: true })
        yield* storage.enqueueMany([job(q, { maxAttempts: 1 }), job(q, { maxAttempts: 1 })])
        const claimed = yield* storage.claim(claimOf(q, 2))
        yield* storage.finalizeMany(
          claimed.map((c) => ({
            jobId: c.jobId,
            runLease: c.runLease,
            outcome: { _tag: "Fail" as const, error: "x" }
          }))
        )
        const held = (yield* storage.queueStats()).queues.find((x) => x.queue === q)
        assert.deepStrictEqual([held!.deadLettered, held!.finalizedTotal.failed, held!.available], [2, 0, 0])
        yield* storage.retryFromDlq(claimed[0]!.jobId)
        const [again] = yield* storage.claim(claimOf(q, 1))
        yield* storage.finalizeMany([
          { jobId: again!.jobId, runLease: again!.runLease, outcome: { _tag: "Complete" } }
        ])
        const done = (yield* storage.queueStats({ exact: true })).queues.find((x) => x.queue === q)
        assert.deepStrictEqual(countsOf(done), {
          paused: false,
          available: 0,
          running: 0,
          scheduled: 0,
          retryable: 0,
          deadLettered: 1,
          finalizedTotal: { completed: 1, failed: 0, cancelled: 0 },
          recent: { completed: 1, failed: 0, cancelled: 0 },
          stored: { completed: 1, failed: 0, cancelled: 0 }
        })
      })
  )

  it.effect("a window outside 1 s - 24 h is a ValidationError", () =>
    Effect.gen(function* () {
      const storage = yield* QueueStorage
      const error = yield* Effect.flip(storage.queueStats({ windowMs: 999 }))
      assert.strictEqual(error._tag, "ValidationError")
      const tooLong = yield* Effect.flip(storage.queueStats({ windowMs: 86_400_001 }))
      assert.strictEqual(tooLong._tag, "ValidationError")
    })
  )
}
