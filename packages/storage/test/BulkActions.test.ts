/**
 * Operator bulk actions in bounded batches (migration 0027, issue 13 item 4, review M3): drainQueue
 * and the DLQ bulk retry/purge take no per-job lock and commit every 500 jobs. Before, they took one
 * advisory lock per job in one transaction: "out of shared memory" (for every session of the
 * server) once the jobs outnumbered the shared lock table, 64 × max_connections entries (19,200
 * on the test server, 6,400 on a stock one). The drain also empties the queue's parked rows
 * (migration 0021: a prune's unclaimed residue kept outside the ring).
 */
import { TestDatabase } from "@awa/testing"
import { assert, layer } from "@effect/vitest"
import { Effect, Layer } from "effect"
import { SqlClient } from "effect/sql"
import { layer as pgLayer } from "../src/PgQueueStorage.ts"
import { QueueStorage } from "../src/QueueStorage.ts"
import { claimOf, fresh, keepNothing } from "./pgFixtures.ts"

// a small carry bound, so a prune parks most of a slot's unclaimed residue
const StorageLive = pgLayer({ rotateMinRows: 1, pruneCarryAfterMs: 0, pruneCarryRows: 100 }).pipe(
  Layer.provideMerge(TestDatabase.layer())
)

const parkedOf = (queue: string) =>
  Effect.flatMap(SqlClient.SqlClient, (sql) =>
    Effect.map(
      sql<{ n: number }>`SELECT count(*)::int AS n FROM awa.parked WHERE queue = ${queue}`,
      (rows) => rows[0]!.n
    )
  )

/** The server's shared lock table, in entries (what one transaction's locks must stay well below). */
const lockTable = Effect.flatMap(SqlClient.SqlClient, (sql) =>
  Effect.map(
    sql<{ n: number }>`
      SELECT (current_setting('max_locks_per_transaction')::int
              * (current_setting('max_connections')::int + current_setting('max_prepared_transactions')::int)) AS n`,
    (rows) => rows[0]!.n
  )
)

layer(StorageLive, { excludeTestServices: true, timeout: "600 seconds" })("bulk actions in batches", (it) => {
  it.effect(
    "drainQueue cancels 100,000 waiting jobs (parked, carried, ready, scheduled), more than the lock table holds, and leaves the running one",
    () =>
      Effect.gen(function* () {
        const storage = yield* QueueStorage
        const sql = yield* SqlClient.SqlClient
        const q = fresh("drain")
        const total = 100_000
        assert.isAbove(total, yield* lockTable, "more jobs than lock-table entries")
        // 2,000 jobs whose slot is pruned unclaimed: a few carried into the current slot, the rest parked
        yield* storage.enqueueMany(
          Array.from({ length: 2000 }, (_, n) => ({ kind: "d", queue: q, args: { n } }))
        )
        assert.strictEqual(yield* storage.rotateWhenDue({ minRows: 1 }), "Rotated")
        assert.strictEqual((yield* storage.prune({ ...keepNothing, carryAfterMs: 0 }))._tag, "Pruned")
        const parked = yield* parkedOf(q)
        assert.isAbove(parked, 1000, "most of the residue parked")
        // one of the carried jobs is running
        const [running] = yield* storage.claim(claimOf(q, 1))
        yield* storage.pauseQueue(q)
        yield* storage.enqueueMany(
          Array.from({ length: total - 3000 }, (_, n) => ({ kind: "d", queue: q, args: { n } }))
        )
        // and some of them scheduled for later
        yield* storage.enqueueMany(
          Array.from({ length: 1000 }, (_, n) => ({
            kind: "d",
            queue: q,
            args: { n },
            runAt: new Date(Date.UTC(2100, 0, 1))
          }))
        )
        const cancelled = yield* storage.drainQueue(q, "emptied by the operator")
        assert.strictEqual(cancelled, total - 1)
        const counts = yield* storage.countByQueueState
        assert.deepStrictEqual(
          counts.filter((c) => c.queue === q).map((c) => [c.state, c.count]),
          [
            ["cancelled", total - 1],
            ["running", 1]
          ]
        )
        assert.strictEqual((yield* storage.getJob(running!.jobId)).state, "running")
        assert.strictEqual(yield* parkedOf(q), 0, "nothing parked behind")
        // and a second drain finds nothing
        assert.strictEqual(yield* storage.drainQueue(q, "again"), 0)
        const [lanes] = yield* sql<{
          n: number
        }>`SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'advisory'`
        assert.strictEqual(lanes!.n, 0, "no lock outlives the drain")
        // the lane still works: a new job is claimed once the queue is resumed
        yield* storage.resumeQueue(q)
        const [fresh1] = yield* storage.enqueueMany([{ kind: "d", queue: q, args: { n: -1 } }])
        assert.deepStrictEqual(
          (yield* storage.claim(claimOf(q, 10))).map((c) => c.jobId),
          [fresh1!.id]
        )
      }),
    { timeout: 600_000 }
  )

  it.effect(
    "retryDlqBulk and purgeDlqBulk work through 60,000 entries, more than the lock table holds",
    () =>
      Effect.gen(function* () {
        const storage = yield* QueueStorage
        const q = fresh("dlq")
        const total = 60_000
        assert.isAbove(total, yield* lockTable, "more entries than lock-table entries")
        yield* storage.configureQueue(q, { dlq: true })
        yield* storage.enqueueMany(
          Array.from({ length: total }, (_, n) => ({ kind: "x", queue: q, args: { n }, maxAttempts: 1 }))
        )
        for (
          let b = yield* storage.claim(claimOf(q, 1000));
          b.length > 0;
          b = yield* storage.claim(claimOf(q, 1000))
        )
          yield* storage.finalizeMany(
            b.map((c) => ({
              jobId: c.jobId,
              runLease: c.runLease,
              outcome: { _tag: "Fail" as const, error: "boom" }
            }))
          )
        assert.strictEqual((yield* storage.listDlq({ queue: q, limit: 1000 })).length, 1000)
        assert.strictEqual(yield* storage.retryDlqBulk({ queue: q }), total)
        assert.deepStrictEqual(yield* storage.listDlq({ queue: q, limit: 10 }), [])
        let claimed = 0
        for (
          let b = yield* storage.claim(claimOf(q, 1000));
          b.length > 0;
          b = yield* storage.claim(claimOf(q, 1000))
        ) {
          claimed += b.length
          yield* storage.finalizeMany(
            b.map((c) => ({
              jobId: c.jobId,
              runLease: c.runLease,
              outcome: { _tag: "Fail" as const, error: "again" }
            }))
          )
        }
        assert.strictEqual(claimed, total, "every retried entry ran again")
        assert.strictEqual(yield* storage.purgeDlqBulk({ queue: q }), total)
        assert.deepStrictEqual(yield* storage.listDlq({ queue: q, limit: 10 }), [])
      }),
    { timeout: 600_000 }
  )
})
