/**
 * Operator bulk actions in bounded batches (migration 0021, issue 13, review M3): drainQueue and
 * the DLQ bulk retry/purge take no per-job lock and commit every 500 jobs. Before, they took one
 * advisory lock per job in one transaction: "out of shared memory" (for every session of the
 * server) once the jobs outnumbered the shared lock table, 64 × max_connections entries (19,200
 * on the test server, 6,400 on a stock one).
 */
import { TestDatabase } from "@awa/testing"
import { assert, layer } from "@effect/vitest"
import { Effect, Layer } from "effect"
import { SqlClient } from "effect/sql"
import { layer as pgLayer } from "../src/PgQueueStorage.ts"
import { QueueStorage } from "../src/QueueStorage.ts"
import { claimOf, fresh } from "./pgFixtures.ts"

const StorageLive = pgLayer().pipe(Layer.provideMerge(TestDatabase.layer()))

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
    "drainQueue cancels 100,000 waiting jobs, more than the lock table holds, and leaves running ones",
    () =>
      Effect.gen(function* () {
        const storage = yield* QueueStorage
        const sql = yield* SqlClient.SqlClient
        const q = fresh("drain")
        const total = 100_000
        assert.isAbove(total, yield* lockTable, "more jobs than lock-table entries")
        yield* storage.pauseQueue(q)
        yield* storage.enqueueMany(
          Array.from({ length: total - 1000 }, (_, n) => ({ kind: "d", queue: q, args: { n } }))
        )
        // some of them scheduled for later, and one running
        yield* storage.enqueueMany(
          Array.from({ length: 1000 }, (_, n) => ({
            kind: "d",
            queue: q,
            args: { n },
            runAt: new Date(Date.UTC(2100, 0, 1))
          }))
        )
        yield* storage.resumeQueue(q)
        const [running] = yield* storage.claim(claimOf(q, 1))
        yield* storage.pauseQueue(q)
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
        // and a second drain finds nothing
        assert.strictEqual(yield* storage.drainQueue(q, "again"), 0)
        const [lanes] = yield* sql<{
          n: number
        }>`SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'advisory'`
        assert.strictEqual(lanes!.n, 0, "no lock outlives the drain")
      }),
    { timeout: 600_000 }
  )

  it.effect(
    "retryDlqBulk and purgeDlqBulk work through 25,000 entries, more than the lock table holds",
    () =>
      Effect.gen(function* () {
        const storage = yield* QueueStorage
        const q = fresh("dlq")
        const total = 25_000
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
