/**
 * Operator retry takes the lane's enqueue lock before the unique row, the order enqueue uses
 * (storage-engine review m2): a retry and a producer of the same key never deadlock. The
 * interleaving that deadlocked before 0019: the producer's transaction holds the lane lock (it
 * enqueued into the lane), the retry waits for it, and the producer then enqueues the retried
 * job's key. Now the retry holds no key while it waits, so the producer wins the key and the retry
 * answers `UniqueConflict`.
 */
import { TestDatabase } from "@awa/testing"
import { PgClient } from "@effect/sql-pg"
import { assert, describe, it } from "@effect/vitest"
import { Deferred, Effect, Fiber, Layer, Redacted } from "effect"
import { SqlClient } from "effect/sql"
import { layer as pgLayer } from "../src/PgQueueStorage.ts"
import { QueueStorage } from "../src/QueueStorage.ts"
import { claimOf, fresh } from "./pgFixtures.ts"

const session = (url: string) =>
  pgLayer().pipe(Layer.provideMerge(PgClient.layer({ url: Redacted.make(url), maxConnections: 1 })))

const untilAdvisoryWaiter = Effect.gen(function* () {
  const sql = yield* SqlClient.SqlClient
  for (;;) {
    const [row] = yield* sql<{ n: number }>`
      SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'advisory' AND NOT granted`
    if (row!.n > 0) return
    yield* Effect.sleep("5 millis")
  }
})

describe("PgQueueStorage: lock order of operator retry and enqueue", () => {
  it.live(
    "a retry waiting for a producer's lane lock holds no key: the producer's duplicate wins, no deadlock",
    () =>
      Effect.gen(function* () {
        const { url } = yield* TestDatabase.acquire()
        const q = fresh("order")
        const keyed = { kind: "k", queue: q, args: { same: 1 }, unique: { byArgs: true }, maxAttempts: 1 }
        const main = session(url)
        // a failed unique job (failed is outside the default mask: its key is free)
        const failed = yield* Effect.gen(function* () {
          const storage = yield* QueueStorage
          const [j] = yield* storage.enqueueMany([keyed])
          const [c] = yield* storage.claim(claimOf(q, 1))
          yield* storage.finalizeMany([
            { jobId: c!.jobId, runLease: c!.runLease, outcome: { _tag: "Fail", error: "x" } }
          ])
          return j!.id
        }).pipe(Effect.provide(main))

        const laneHeld = yield* Deferred.make<void>()
        const retryWaits = yield* Deferred.make<void>()
        const producer = yield* Effect.gen(function* () {
          const sql = yield* SqlClient.SqlClient
          const storage = yield* QueueStorage
          return yield* sql.withTransaction(
            Effect.gen(function* () {
              // holds the lane's enqueue lock to commit
              yield* storage.enqueueMany([{ kind: "k", queue: q, args: { other: 1 } }])
              yield* Deferred.succeed(laneHeld, undefined)
              yield* Deferred.await(retryWaits)
              return yield* storage.enqueueMany([keyed])
            })
          )
        }).pipe(Effect.provide(session(url)), Effect.result, Effect.forkChild)
        yield* Deferred.await(laneHeld)
        const retry = yield* Effect.flatMap(QueueStorage, (s) => s.retryJob(failed)).pipe(
          Effect.provide(session(url)),
          Effect.result,
          Effect.forkChild
        )
        yield* untilAdvisoryWaiter.pipe(Effect.provide(main))
        yield* Deferred.succeed(retryWaits, undefined)
        const produced = yield* Fiber.join(producer)
        const retried = yield* Fiber.join(retry)
        assert.strictEqual(
          produced._tag,
          "Success",
          `producer: ${String(produced._tag === "Failure" && produced.failure)}`
        )
        assert.strictEqual(retried._tag, "Failure")
        if (retried._tag === "Failure") assert.strictEqual(retried.failure._tag, "UniqueConflict")
      }).pipe(Effect.scoped),
    60_000
  )
})
