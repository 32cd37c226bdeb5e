/**
 * Operations that need READ COMMITTED (issue 13 item 3, review C1/A2, migration 0027,
 * docs/adr/0021-server-defaults.md decision 5). Their SQL functions refuse other levels (AWI01);
 * inside the caller's REPEATABLE READ / SERIALIZABLE transaction the storage layer answers the
 * typed `ReadCommittedRequired`, and nothing was done. Enqueue is not among them: it is diverted
 * to `deferred` (Isolation.test.ts).
 */
import { ReadCommittedRequired } from "@awa/core"
import { TestDatabase } from "@awa/testing"
import { assert, layer } from "@effect/vitest"
import { Deferred, Effect, Fiber, Layer } from "effect"
import { SqlClient } from "effect/sql"
import { layer as pgLayer } from "../src/PgQueueStorage.ts"
import { QueueStorage } from "../src/QueueStorage.ts"
import { claimOf, completeAll, fresh, keepNothing } from "./pgFixtures.ts"

const StorageLive = pgLayer({ rotateMinRows: 1, pruneCarryAfterMs: 0 }).pipe(
  Layer.provideMerge(TestDatabase.layer())
)

/** A job completed in the current slot, a rotation, a prune of the slot left behind. */
const rotateAndPrune = Effect.gen(function* () {
  const storage = yield* QueueStorage
  const q = fresh("filler")
  yield* storage.enqueueMany([{ kind: "f", queue: q, args: {} }])
  yield* completeAll(yield* storage.claim(claimOf(q, 10)))
  assert.strictEqual(yield* storage.rotateWhenDue({ minRows: 1 }), "Rotated")
  assert.strictEqual((yield* storage.prune({ ...keepNothing, carryAfterMs: 0 }))._tag, "Pruned")
})

/** Runs `effect` in a transaction begun at `level`; its failure. */
const failsIn = <A, E, R>(level: string, effect: Effect.Effect<A, E, R>) =>
  Effect.flatMap(SqlClient.SqlClient, (sql) =>
    sql
      .withTransaction(effect)
      .pipe(Effect.provideService(SqlClient.BeginTransaction, `BEGIN ISOLATION LEVEL ${level}`), Effect.flip)
  )

layer(StorageLive, { excludeTestServices: true, timeout: "60 seconds" })(
  "operations that need READ COMMITTED",
  (it) => {
    it.effect(
      "prune in a REPEATABLE READ transaction whose snapshot predates a committed job is refused; the job is claimed (review A2)",
      () =>
        Effect.gen(function* () {
          const storage = yield* QueueStorage
          const sql = yield* SqlClient.SqlClient
          const q = fresh("a2")
          yield* rotateAndPrune
          // the prune's snapshot is taken first; then a job commits into the current slot and the
          // ring rotates: that slot is next for prune, and its only row is unclaimed
          const snapshot = yield* Deferred.make<void>()
          const go = yield* Deferred.make<void>()
          const fiber = yield* sql
            .withTransaction(
              Effect.gen(function* () {
                yield* sql`SELECT count(*) FROM awa.queue_meta`
                yield* Deferred.succeed(snapshot, undefined)
                yield* Deferred.await(go)
                return yield* storage.prune({ ...keepNothing, carryAfterMs: 0 })
              })
            )
            .pipe(
              Effect.provideService(SqlClient.BeginTransaction, "BEGIN ISOLATION LEVEL REPEATABLE READ"),
              Effect.forkChild({ startImmediately: true })
            )
          yield* Deferred.await(snapshot)
          const [job] = yield* storage.enqueueMany([{ kind: "a2", queue: q, args: {} }])
          assert.strictEqual(yield* storage.rotateWhenDue({ minRows: 1 }), "Rotated")
          yield* Deferred.succeed(go, undefined)
          const refused = yield* Effect.flip(Fiber.join(fiber))
          assert.deepStrictEqual(
            refused,
            new ReadCommittedRequired({ operation: "prune", isolation: "REPEATABLE READ" })
          )
          // without the guard that prune truncated the slot: the job was gone without a trace
          assert.deepStrictEqual(
            (yield* storage.claim(claimOf(q, 10))).map((c) => c.jobId),
            [job!.id]
          )
        })
    )

    for (const level of ["REPEATABLE READ", "SERIALIZABLE"]) {
      it.effect(`every such operation in a ${level} transaction fails with ReadCommittedRequired`, () =>
        Effect.gen(function* () {
          const storage = yield* QueueStorage
          const q = fresh("refused")
          const [job] = yield* storage.enqueueMany([{ kind: "r", queue: q, args: {} }])
          const token = { jobId: job!.id, runLease: 1n }
          const operations: ReadonlyArray<readonly [string, Effect.Effect<unknown, unknown, never>]> = [
            ["claim", storage.claim(claimOf(q, 1))],
            ["finalize", storage.finalizeMany([{ ...token, outcome: { _tag: "Complete" } }])],
            ["heartbeat", storage.heartbeatMany([token])],
            ["promote", storage.promoteDue(10)],
            ["rescue", storage.rescueStale({ stalenessMs: 60_000, limit: 10 })],
            ["rescue", storage.rescueDeadlines(10)],
            ["rotate", storage.rotate],
            ["rotate", storage.rotateHistory(60_000)],
            ["prune", storage.prune(keepNothing)],
            ["pruneHistory", storage.pruneHistory(keepNothing)],
            ["trimLedgers", storage.trimLedgers(100)],
            ["cancelJob", storage.cancelJob(job!.id, "no")],
            ["cancelByUniqueKey", storage.cancelByUniqueKey("00", "no")],
            ["retryJob", storage.retryJob(job!.id)],
            ["retryFromDlq", storage.retryFromDlq(job!.id)],
            ["retryDlqBulk", storage.retryDlqBulk({}, { all: true })],
            ["purgeDlqBulk", storage.purgeDlqBulk({}, { all: true })],
            ["cleanupDlq", storage.cleanupDlq(60_000, 10)],
            ["drainQueue", storage.drainQueue(q, "no")]
          ]
          for (const [operation, effect] of operations) {
            const error = yield* failsIn(level, effect)
            assert.deepStrictEqual(
              { operation, error },
              { operation, error: new ReadCommittedRequired({ operation, isolation: level }) }
            )
          }
          // and outside it, the job is untouched
          assert.strictEqual((yield* storage.getJob(job!.id)).state, "available")
        })
      )
    }
  }
)
