/**
 * Isolation levels (issue 13, review C1, docs/adr/0017-server-defaults.md). The ring protocol's
 * guards re-read after a lock in a new statement, which sees the previous holder's commit only
 * under READ COMMITTED. Enqueue runs in the caller's transaction, whatever its level: outside
 * READ COMMITTED it is diverted to `deferred` and promoted by the leader. These tests hold such a
 * transaction open while the ring rotates and prunes underneath it, then commit, promote and claim.
 */
import { ReadCommittedRequired } from "@awa/core"
import { TestDatabase } from "@awa/testing"
import { assert, layer } from "@effect/vitest"
import { Deferred, Effect, Fiber, Layer } from "effect"
import { SqlClient } from "effect/sql"
import { layer as pgLayer } from "../src/PgQueueStorage.ts"
import { type EnqueuedJob, QueueStorage } from "../src/QueueStorage.ts"
import { claimOf, completeAll, fresh, keepNothing } from "./pgFixtures.ts"

type Level = "REPEATABLE READ" | "SERIALIZABLE"

/** The queue ring's current generation. */
const generation = Effect.flatMap(SqlClient.SqlClient, (sql) =>
  Effect.map(sql<{ g: string }>`SELECT generation::text AS g FROM awa.ring_current('queue')`, (rows) =>
    BigInt(rows[0]!.g)
  )
)

/**
 * Moves the ring on by one slot and prunes the slot left behind: a job completed in the current
 * slot, a rotation, a prune. Returns the pruned generation.
 */
const rotateAndPrune = Effect.gen(function* () {
  const storage = yield* QueueStorage
  const q = fresh("filler")
  yield* storage.enqueueMany([{ kind: "f", queue: q, args: {} }])
  yield* completeAll(yield* storage.claim(claimOf(q, 10)))
  const before = yield* generation
  assert.strictEqual(yield* storage.rotateWhenDue({ minRows: 1 }), "Rotated")
  const pruned = yield* storage.prune({ ...keepNothing, carryAfterMs: 0 })
  assert.deepStrictEqual(pruned, { _tag: "Pruned", generation: before, carried: 0 })
  return before
})

/**
 * Opens a transaction at `level`, takes its snapshot, then waits for `go` before running
 * `enqueue` and committing. `snapshot` opens once the snapshot is taken.
 */
const heldTransaction = <A, E>(
  level: Level,
  enqueue: Effect.Effect<A, E, QueueStorage | SqlClient.SqlClient>
) =>
  Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    const snapshot = yield* Deferred.make<void>()
    const go = yield* Deferred.make<void>()
    const fiber = yield* sql
      .withTransaction(
        Effect.gen(function* () {
          yield* sql.unsafe(`SET TRANSACTION ISOLATION LEVEL ${level}`).unprepared
          // the first query takes the transaction's snapshot (what the review's A1 did)
          yield* sql`SELECT count(*) FROM awa.queue_meta`
          yield* Deferred.succeed(snapshot, undefined)
          yield* Deferred.await(go)
          return yield* enqueue
        })
      )
      .pipe(Effect.forkChild({ startImmediately: true }))
    yield* Deferred.await(snapshot)
    return { go, fiber }
  })

const StorageLive = pgLayer({ rotateMinRows: 1, pruneCarryAfterMs: 0 }).pipe(
  Layer.provideMerge(TestDatabase.layer())
)

layer(StorageLive, { excludeTestServices: true, timeout: "60 seconds" })(
  "enqueue at any isolation level",
  (it) => {
    const raced = (
      level: Level,
      label: string,
      jobs: (q: string) => Parameters<QueueStorage["Service"]["enqueueMany"]>[0]
    ) =>
      it.effect(`${label} at ${level}, while the ring rotates and prunes: deferred, then claimable`, () =>
        Effect.gen(function* () {
          const storage = yield* QueueStorage
          const q = fresh(label.replaceAll(" ", "-"))
          yield* rotateAndPrune // a slot behind the current one that can be pruned next
          const { go, fiber } = yield* heldTransaction(
            level,
            Effect.flatMap(QueueStorage, (s) => s.enqueueMany(jobs(q)))
          )
          // the transaction's snapshot still shows the ring before these: its slot gets pruned
          yield* rotateAndPrune
          yield* rotateAndPrune
          yield* Deferred.succeed(go, undefined)
          const enqueued: ReadonlyArray<EnqueuedJob> = yield* Fiber.join(fiber)
          // the leader's promote, then a claim: every job is claimed, in order (before 0018 they sat
          // in the pruned slot, never claimable)
          yield* storage.promoteDue(1000)
          const claimed = yield* storage.claim(claimOf(q, 100))
          assert.deepStrictEqual(
            claimed.map((c) => c.jobId),
            enqueued.map((e) => e.id)
          )
          // nothing went to the ring from that transaction: the jobs were deferred
          assert.deepStrictEqual(
            enqueued.map((e) => e.state),
            enqueued.map(() => "scheduled")
          )
          yield* completeAll(claimed)
          // and the ring keeps rotating
          yield* rotateAndPrune
        })
      )

    for (const level of ["REPEATABLE READ", "SERIALIZABLE"] as const) {
      raced(level, "one job", (q) => [{ kind: "i", queue: q, args: { n: 1 } }])
      raced(level, "a batch", (q) => [1, 2, 3].map((n) => ({ kind: "i", queue: q, args: { n } })))
      raced(level, "a unique job", (q) => [{ kind: "i", queue: q, args: { n: 1 }, unique: { byArgs: true } }])
    }

    it.effect("enqueue(jsonb) (cron) at REPEATABLE READ is deferred too", () =>
      Effect.gen(function* () {
        const storage = yield* QueueStorage
        const sql = yield* SqlClient.SqlClient
        const q = fresh("legacy")
        const row = `[{"kind":"i","queue":"${q}","priority":2,"args":{},"metadata":{},"tags":[],"max_attempts":25,"unique_states":0}]`
        const { go, fiber } = yield* heldTransaction(
          "REPEATABLE READ",
          sql<{ job_id: bigint; state: string }>`SELECT job_id, state FROM awa.enqueue(${row}::jsonb)`
        )
        yield* rotateAndPrune
        yield* Deferred.succeed(go, undefined)
        const [out] = yield* Fiber.join(fiber)
        yield* storage.promoteDue(1000)
        assert.deepStrictEqual(
          (yield* storage.claim(claimOf(q, 10))).map((c) => c.jobId),
          [out!.job_id]
        )
        assert.strictEqual(out!.state, "scheduled")
      })
    )
  }
)

/** Runs `effect` in a transaction begun at REPEATABLE READ; its failure. */
const failsInRepeatableRead = <A, E, R>(effect: Effect.Effect<A, E, R>) =>
  Effect.flatMap(SqlClient.SqlClient, (sql) =>
    sql
      .withTransaction(effect)
      .pipe(
        Effect.provideService(SqlClient.BeginTransaction, "BEGIN ISOLATION LEVEL REPEATABLE READ"),
        Effect.flip
      )
  )

layer(StorageLive, { excludeTestServices: true, timeout: "60 seconds" })(
  "operations that need READ COMMITTED",
  (it) => {
    it.effect(
      "prune in a REPEATABLE READ transaction whose snapshot predates a committed job is refused; the job is claimed (review A2)",
      () =>
        Effect.gen(function* () {
          const storage = yield* QueueStorage
          const q = fresh("a2")
          yield* rotateAndPrune
          // the prune's snapshot is taken now; then a job commits into the current slot, and the
          // ring rotates: that slot is next for prune, and its only row is unclaimed
          const { go, fiber } = yield* heldTransaction(
            "REPEATABLE READ",
            Effect.flatMap(QueueStorage, (s) => s.prune({ ...keepNothing, carryAfterMs: 0 }))
          )
          const [job] = yield* storage.enqueueMany([{ kind: "a2", queue: q, args: {} }])
          assert.strictEqual(yield* storage.rotateWhenDue({ minRows: 1 }), "Rotated")
          yield* Deferred.succeed(go, undefined)
          const refused = yield* Effect.flip(Fiber.join(fiber))
          assert.strictEqual(refused._tag, "ReadCommittedRequired")
          // before 0021 that prune truncated the slot: the job was gone without a trace
          assert.deepStrictEqual(
            (yield* storage.claim(claimOf(q, 10))).map((c) => c.jobId),
            [job!.id]
          )
        })
    )

    it.effect("every such operation in a REPEATABLE READ transaction fails with ReadCommittedRequired", () =>
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
          const error = yield* failsInRepeatableRead(effect)
          assert.deepStrictEqual(
            { operation, error },
            { operation, error: new ReadCommittedRequired({ operation, isolation: "REPEATABLE READ" }) }
          )
        }
        // and outside it, the job is untouched
        assert.strictEqual((yield* storage.getJob(job!.id)).state, "available")
      })
    )
  }
)
