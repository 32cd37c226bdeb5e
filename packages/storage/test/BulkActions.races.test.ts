/**
 * A drain in batches (migration 0027) racing the other writers of its rows: claims (and the
 * unpark that promoteDue runs) and single cancels, each on its own connection. No per-job lock
 * orders them any more: the lane's claim lock does (drain, claim, unpark, and cancel_job's
 * re-check of the cursor), and the row lock of a DELETE on `parked` / `deferred`. Every job must
 * end exactly one way, once: claimed and completed, or cancelled by the drain, or cancelled by
 * the operator, with one terminal row; and no session deadlocks (review m3).
 */
import { TestDatabase } from "@awa/testing"
import { assert, describe, it } from "@effect/vitest"
import { Deferred, Effect, Exit, Ref } from "effect"
import { SqlClient } from "effect/sql"
import { QueueStorage } from "../src/QueueStorage.ts"
import { claimOf, completeAll, eagerStorage, fresh, keepNothing } from "./pgFixtures.ts"

const total = 10_000

describe("a drain in batches racing claims and cancels", () => {
  it.live(
    "every job ends exactly one way, once",
    () =>
      Effect.gen(function* () {
        const { url } = yield* TestDatabase.acquire()
        const q = fresh("race")
        // some jobs parked (a small carry bound), the rest in the ring
        const ids = yield* Effect.gen(function* () {
          const storage = yield* QueueStorage
          const sql = yield* SqlClient.SqlClient
          const first = yield* storage.enqueueMany(
            Array.from({ length: 2000 }, (_, n) => ({ kind: "r", queue: q, args: { n } }))
          )
          assert.strictEqual(yield* storage.rotateWhenDue({ minRows: 1 }), "Rotated")
          assert.strictEqual((yield* storage.prune({ ...keepNothing, carryAfterMs: 0 }))._tag, "Pruned")
          const [parked] = yield* sql<{ n: number }>`SELECT count(*)::int AS n FROM awa.parked`
          assert.isAbove(parked!.n, 1500, "parked rows")
          const rest = yield* storage.enqueueMany(
            Array.from({ length: total - 2000 }, (_, n) => ({ kind: "r", queue: q, args: { n } }))
          )
          return [...first, ...rest].map((j) => j.id)
        }).pipe(Effect.provide(eagerStorage(url, 1, { pruneCarryRows: 20 })))

        const done = yield* Deferred.make<void>()
        const claimed = yield* Ref.make<Array<bigint>>([])
        const cancelled = yield* Ref.make<Array<bigint>>([])
        const drainer = Effect.gen(function* () {
          const storage = yield* QueueStorage
          return yield* storage.drainQueue(q, "drained")
        }).pipe(Effect.ensuring(Deferred.succeed(done, undefined)), Effect.provide(eagerStorage(url, 1)))
        const claimer = Effect.gen(function* () {
          const storage = yield* QueueStorage
          while (!(yield* Deferred.isDone(done))) {
            yield* storage.promoteDue(50) // unparks too
            const batch = yield* storage.claim(claimOf(q, 25))
            yield* Ref.update(claimed, (a) => [...a, ...batch.map((c) => c.jobId)])
            yield* completeAll(batch)
          }
        }).pipe(Effect.provide(eagerStorage(url, 1)))
        // from the newest job down, while the drain works from the oldest up
        const canceller = Effect.gen(function* () {
          const storage = yield* QueueStorage
          for (let i = ids.length - 1; i >= 0 && !(yield* Deferred.isDone(done)); i -= 7) {
            const exit = yield* Effect.exit(storage.cancelJob(ids[i]!, "by hand"))
            if (Exit.isSuccess(exit) && exit.value.state === "cancelled")
              yield* Ref.update(cancelled, (a) => [...a, ids[i]!])
          }
        }).pipe(Effect.provide(eagerStorage(url, 1)))

        const [drained] = yield* Effect.all([drainer, claimer, canceller], { concurrency: "unbounded" })

        const byClaim = new Set(yield* Ref.get(claimed))
        const byCancel = new Set(yield* Ref.get(cancelled))
        yield* Effect.gen(function* () {
          const sql = yield* SqlClient.SqlClient
          const storage = yield* QueueStorage
          assert.strictEqual(byClaim.size, (yield* Ref.get(claimed)).length, "no job claimed twice")
          for (const id of byCancel) assert.isFalse(byClaim.has(id), `job ${id} claimed and cancelled`)
          assert.strictEqual(drained + byCancel.size + byClaim.size, total, "each job ended one way")
          const counts = yield* storage.countByQueueState
          assert.deepStrictEqual(
            counts.filter((c) => c.queue === q).map((c) => [c.state, c.count]),
            [
              ...(drained + byCancel.size > 0 ? [["cancelled", drained + byCancel.size]] : []),
              ...(byClaim.size > 0 ? [["completed", byClaim.size]] : [])
            ]
          )
          const twice = yield* sql<{ job_id: bigint }>`
            SELECT job_id FROM awa.terminal WHERE queue = ${q} GROUP BY job_id HAVING count(*) > 1`
          assert.deepStrictEqual(twice, [], "one terminal row per job")
          const [parked] = yield* sql<{ n: number }>`SELECT count(*)::int AS n FROM awa.parked`
          assert.strictEqual(parked!.n, 0, "nothing parked behind")
        }).pipe(Effect.provide(eagerStorage(url, 1)))
      }).pipe(Effect.scoped),
    120_000
  )
})
