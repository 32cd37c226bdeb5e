import { TestDatabase } from "@awa/testing"
import { assert, describe, it, layer } from "@effect/vitest"
import { Effect, Layer } from "effect"
import { layer as pgLayer } from "../src/PgQueueStorage.ts"
import { QueueStorage } from "../src/QueueStorage.ts"
import * as SimQueueStorage from "../src/SimQueueStorage.ts"
import { suite } from "./contract/QueueStatsContract.ts"
import { claimOf, completeAll, fresh, keepAll, withEagerDatabase } from "./pgFixtures.ts"

describe("queueStats", () => {
  layer(pgLayer().pipe(Layer.provideMerge(TestDatabase.layer())), {
    excludeTestServices: true,
    timeout: "60 seconds"
  })("PgQueueStorage", (it) => suite(it))
  layer(SimQueueStorage.layer)("SimQueueStorage", (it) => suite(it))

  // Postgres only: finalizations of reclaimed ring slots are counted by their prune roll-ups,
  // also once trimLedgers has folded those into the carried totals; backlog across slots.
  it.live(
    "totals survive rotation, prune and ledger trimming; a backlog spread over ring slots is counted whole",
    () =>
      withEagerDatabase({}, () =>
        Effect.gen(function* () {
          const storage = yield* QueueStorage
          const q = fresh("stats-ring")
          // 40 rounds: enqueue 3, complete 2, rotate and prune; the queue ring (16 slots) wraps
          // twice and trimLedgers folds the oldest prunes into the carried totals
          for (let round = 0; round < 40; round++) {
            yield* storage.enqueueMany([0, 1, 2].map((n) => ({ kind: "k", queue: q, args: { round, n } })))
            yield* completeAll(yield* storage.claim(claimOf(q, 2)))
            yield* storage.rotateWhenDue({ minRows: 1, maxAgeMs: 0 })
            yield* storage.prune({ ...keepAll, carryAfterMs: 0 })
            yield* storage.trimLedgers(1000)
          }
          const stats = (yield* storage.queueStats({ exact: true })).queues.find((x) => x.queue === q)!
          assert.deepStrictEqual(
            [stats.available, stats.running, stats.finalizedTotal.completed, stats.stored!.completed],
            [40, 0, 80, 80]
          )
          // the recent window is bounded by what the ledger still holds row by row: shorter
          // than asked once trimmed, and it then counts fewer than the total
          const report = yield* storage.queueStats({ windowMs: 86_400_000 })
          const mine = report.queues.find((x) => x.queue === q)!
          assert.isTrue(report.windowStart.getTime() > report.asOf.getTime() - 86_400_000)
          assert.isTrue(mine.recent.completed < 80 && mine.recent.completed > 0)
          const counts = (yield* storage.countByQueueState).filter((x) => x.queue === q)
          assert.deepStrictEqual(
            counts.map((x) => [x.state, x.count]),
            [
              ["available", 40],
              ["completed", 80]
            ]
          )
        })
      ),
    120_000
  )
})
