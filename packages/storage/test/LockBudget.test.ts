/**
 * The shared lock table of a stock server (issue 13 item 4, review M4, migration 0028): 64 entries
 * per connection slot, 6,400 with the default 100 connections, shared by every session. Twenty
 * workers each holding a full finalize(512) transaction open at once must fit in it with room to
 * spare. The test server may have more connection slots (the embedded one has 300, so a larger
 * table), so the test does not wait for "out of shared memory": it counts what the twenty
 * sessions hold at the same moment (`pg_locks`, fast-path entries excluded: they live in each
 * backend, not in the shared table) against the stock size. Before 0028 each held ~590 (512
 * per-attempt advisory locks), ~11,700 in all.
 */
import { TestDatabase } from "@awa/testing"
import { PgClient } from "@effect/sql-pg"
import { assert, describe, it } from "@effect/vitest"
import { Deferred, Effect, Fiber, Layer, Redacted } from "effect"
import { SqlClient } from "effect/sql"
import { layer as pgLayer } from "../src/PgQueueStorage.ts"
import { type ClaimedJob, QueueStorage } from "../src/QueueStorage.ts"
import { claimOf, dueForAnalyze, fresh, settleStatistics } from "./pgFixtures.ts"

const workers = 20
const batch = 512
/** max_locks_per_transaction (default 64) × max_connections (default 100). */
const stockLockTable = 64 * 100

describe("lock budget", () => {
  it.live(`${workers} sessions holding finalize(${batch}) at once fit a stock server's lock table`, () =>
    Effect.gen(function* () {
      const { url } = yield* TestDatabase.acquire()
      const storageOn = (maxConnections: number) =>
        pgLayer().pipe(Layer.provideMerge(PgClient.layer({ url: Redacted.make(url), maxConnections })))
      const q = fresh("budget")
      const batches = yield* Effect.gen(function* () {
        const storage = yield* QueueStorage
        const [setting] = yield* (yield* SqlClient.SqlClient)<{ n: number }>`
          SELECT current_setting('max_locks_per_transaction')::int AS n`
        assert.strictEqual(setting!.n, 64, "the server runs with the default max_locks_per_transaction")
        yield* storage.enqueueMany(
          Array.from({ length: workers * batch }, (_, n) => ({ kind: "b", queue: q, args: { n } }))
        )
        const out: Array<ReadonlyArray<ClaimedJob>> = []
        for (let w = 0; w < workers; w++) out.push(yield* storage.claim(claimOf(q, batch)))
        return out
      }).pipe(Effect.provide(storageOn(2)))
      // Autovacuum would vacuum and analyze the 10,240 new rows of each ring table on its own
      // schedule; the new statistics invalidate the sessions' cached plans, and a finalize
      // re-planned inside the measured transaction locks every ring child (~200 entries more per
      // session: 3,454 and 4,178 in all under load, 1,440 otherwise). Done here, once the
      // connections that wrote the rows have closed and reported them, before the sessions cache
      // their plans, it leaves nothing for autovacuum until they have reported.
      yield* settleStatistics(url)
      assert.deepStrictEqual(
        batches.map((b) => b.length),
        batches.map(() => batch)
      )

      // each session: finalize its batch in a transaction, report its lock-table entries, and
      // hold everything until all twenty have reported
      const allReported = yield* Deferred.make<void>()
      const reports = yield* Effect.forEach(batches, () => Deferred.make<number>())
      const sessions = yield* Effect.forEach(batches, (claimed, w) =>
        Effect.gen(function* () {
          const storage = yield* QueueStorage
          const sql = yield* SqlClient.SqlClient
          // a worker's session has finalized before: its plans are cached (the first call of a
          // session also locks what planning opened, ~230 entries). In a transaction, so that it
          // runs on this pooled connection, not on the layer's own connections (ADR 0033).
          yield* sql.withTransaction(
            storage.finalizeMany([{ jobId: -1n, runLease: 1n, outcome: { _tag: "Complete" } }])
          )
          yield* sql.withTransaction(
            Effect.gen(function* () {
              const results = yield* storage.finalizeMany(
                claimed.map((c) => ({
                  jobId: c.jobId,
                  runLease: c.runLease,
                  outcome: { _tag: "Complete" as const }
                }))
              )
              assert.isTrue(results.every((r) => r._tag === "Applied"))
              const [held] = yield* sql<{ n: number }>`
                SELECT count(*)::int AS n FROM pg_locks WHERE pid = pg_backend_pid() AND NOT fastpath`
              yield* Deferred.succeed(reports[w]!, held!.n)
              yield* Deferred.await(allReported)
            })
          )
        }).pipe(Effect.provide(storageOn(1)), Effect.forkChild({ startImmediately: true }))
      )
      const held = yield* Effect.forEach(reports, (r) => Deferred.await(r))
      // autovacuum had no reason to analyze a table, and so to invalidate the sessions' plans,
      // while they measured (the warm-up finalizes nothing)
      const due = yield* dueForAnalyze(url)
      const total = held.reduce((a, b) => a + b, 0)
      yield* Deferred.succeed(allReported, undefined)
      yield* Effect.forEach(sessions, (s) => Fiber.join(s))
      assert.deepStrictEqual(due, [], "tables due for autovacuum's analyze while the sessions measured")
      yield* Effect.logInfo(
        `lock budget: ${workers} sessions held ${total} shared lock-table entries at once`
      )
      assert.isBelow(
        total,
        stockLockTable / 2,
        `the ${workers} sessions held ${total} lock-table entries at once (${held.join(", ")})`
      )
      const counts = yield* Effect.flatMap(QueueStorage, (s) => s.countByQueueState).pipe(
        Effect.provide(storageOn(1))
      )
      assert.deepStrictEqual(
        counts.filter((c) => c.queue === q).map((c) => [c.state, c.count]),
        [["completed", workers * batch]]
      )
    }).pipe(Effect.scoped)
  )
})
