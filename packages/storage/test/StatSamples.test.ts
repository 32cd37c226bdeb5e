/**
 * The leader's samples behind the statistics' rates and the dashboard's last-hour series
 * (migration 0031, issue 18 item 1, issue 19): enqueues counted one sample period late by job id,
 * finalizations as differences of the ledger totals, a rolled-back enqueue never counted, a
 * sample skipped when another was taken within the minimum interval; and the prune state
 * recorded only on change. The same suite on Postgres (real time) and the simulation (TestClock).
 */
import { randomUUID } from "node:crypto"
import { TestDatabase } from "@awa/testing"
import type { Vitest } from "@effect/vitest"
import { assert, describe, layer } from "@effect/vitest"
import { Effect, Layer } from "effect"
import { SqlClient } from "effect/sql"
import { TestClock } from "effect/testing"
import { layer as pgLayer } from "../src/PgQueueStorage.ts"
import { type QueueStats, QueueStorage } from "../src/QueueStorage.ts"
import * as SimQueueStorage from "../src/SimQueueStorage.ts"

const fresh = (label: string) => `${label}-${randomUUID().slice(0, 8)}`
const claimOf = (queue: string, max: number) => ({ queue, max, deadlineMs: 0, agingIntervalMs: 0 })
const sampleNow = { minIntervalMs: 0, keepMs: 7_200_000 }

const suite = (it: Vitest.MethodsNonLive<QueueStorage>, tick: Effect.Effect<void>) => {
  const sample = Effect.flatMap(QueueStorage, (s) => Effect.andThen(tick, s.sampleQueueStats(sampleNow)))
  const ratesOf = (queue: string) =>
    Effect.map(
      Effect.flatMap(QueueStorage, (s) => s.queueStats({ windowMs: 3_600_000 })),
      (report) => report.queues.find((q) => q.queue === queue)?.rates ?? null
    )
  const counts = (rates: QueueStats["rates"]) =>
    rates === null ? null : [rates.enqueued, rates.completed, rates.failed, rates.cancelled]

  it.effect("enqueues are counted one sample late, finalizations at the next sample, per queue", () =>
    Effect.gen(function* () {
      const storage = yield* QueueStorage
      const a = fresh("rate-a")
      const b = fresh("rate-b")
      assert.isNotNull(yield* sample)
      yield* storage.enqueueMany([1, 2, 3, 4, 5].map((n) => ({ kind: "k", queue: a, args: { n } })))
      yield* storage.enqueueMany([1, 2, 3].map((n) => ({ kind: "k", queue: b, args: { n } })))
      assert.isNotNull(yield* sample)
      // ids handed out before this sample are counted at the next one
      assert.deepStrictEqual(counts(yield* ratesOf(a)), [0, 0, 0, 0])
      const claimed = yield* storage.claim(claimOf(a, 3))
      yield* storage.finalizeMany([
        { jobId: claimed[0]!.jobId, runLease: claimed[0]!.runLease, outcome: { _tag: "Complete" } },
        { jobId: claimed[1]!.jobId, runLease: claimed[1]!.runLease, outcome: { _tag: "Complete" } },
        {
          jobId: claimed[2]!.jobId,
          runLease: claimed[2]!.runLease,
          outcome: { _tag: "Fail", error: "boom" }
        }
      ])
      assert.isNotNull(yield* sample)
      const rates = (yield* ratesOf(a))!
      assert.deepStrictEqual(counts(rates), [5, 2, 1, 0])
      assert.isAbove(rates.completedPerSecond, 0)
      assert.deepStrictEqual(counts(yield* ratesOf(b)), [3, 0, 0, 0])
      const report = yield* storage.queueStats({ windowMs: 3_600_000 })
      assert.isNotNull(report.rates)
      assert.match(report.staleness, /rates: from the leader's samples/)
      // the series: the same counts, in buckets
      const history = yield* storage.queueHistory({ windowMs: 3_600_000, bucketMs: 60_000 })
      const series = history.queues.find((q) => q.queue === a)!.buckets
      const sum = (k: "enqueued" | "completed" | "failed") => series.reduce((n, x) => n + x[k], 0)
      assert.deepStrictEqual([sum("enqueued"), sum("completed"), sum("failed")], [5, 2, 1])
      // nothing new: the next sample adds nothing
      assert.isNotNull(yield* sample)
      assert.isNotNull(yield* sample)
      assert.deepStrictEqual(counts(yield* ratesOf(a)), [5, 2, 1, 0])
    })
  )

  it.effect("a sample within the minimum interval of the last is skipped", () =>
    Effect.gen(function* () {
      const storage = yield* QueueStorage
      assert.isNotNull(yield* sample)
      assert.isNull(yield* storage.sampleQueueStats({ minIntervalMs: 3_600_000, keepMs: 7_200_000 }))
    })
  )

  it.effect("the prune state is written when it changes, not when it repeats", () =>
    Effect.gen(function* () {
      const storage = yield* QueueStorage
      yield* storage.recordPruneState("queue", { outcome: "ok", reason: null })
      assert.isTrue(yield* storage.recordPruneState("queue", { outcome: "blocked", reason: "lock" }))
      assert.isFalse(yield* storage.recordPruneState("queue", { outcome: "blocked", reason: "lock" }))
      assert.isTrue(yield* storage.recordPruneState("queue", { outcome: "blocked", reason: "unclaimed" }))
      assert.isTrue(yield* storage.recordPruneState("queue", { outcome: "ok", reason: null }))
      assert.isFalse(yield* storage.recordPruneState("queue", { outcome: "ok", reason: null }))
    })
  )
}

describe("stat samples", () => {
  layer(pgLayer().pipe(Layer.provideMerge(TestDatabase.layer())), {
    excludeTestServices: true,
    timeout: "60 seconds"
  })("PgQueueStorage", (it) => {
    suite(it, Effect.void)

    it.effect("an enqueue rolled back is never counted", () =>
      Effect.gen(function* () {
        const storage = yield* QueueStorage
        const sql = yield* SqlClient.SqlClient
        const q = fresh("rate-rollback")
        yield* sql
          .withTransaction(
            Effect.andThen(
              storage.enqueueMany([{ kind: "k", queue: q, args: {} }]),
              Effect.fail("roll back" as const)
            )
          )
          .pipe(Effect.ignore)
        yield* storage.enqueueMany([{ kind: "k", queue: q, args: { kept: true } }])
        for (let i = 0; i < 3; i++) assert.isNotNull(yield* storage.sampleQueueStats(sampleNow))
        const rates = (yield* storage.queueStats({ windowMs: 3_600_000 })).queues.find((x) => x.queue === q)!
          .rates!
        assert.strictEqual(rates.enqueued, 1)
      })
    )
  })
  layer(SimQueueStorage.layer)("SimQueueStorage", (it) => suite(it, TestClock.adjust(1000)))
})
