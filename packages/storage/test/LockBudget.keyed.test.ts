/**
 * The lock budget of the keyed claim (migration 0036 raised its key cap from 32 to 64 per call,
 * docs/adr/0029-key-execution-grants.md "Costs and limits"). A keyed claim holds one transaction
 * advisory lock per key it tried until it commits, in the shared lock table of a stock server:
 * 64 entries per connection slot, 6,400 with the default 100 connections. Twenty workers each
 * holding a claim of 64 distinct keys open at once must fit with room to spare. As in
 * LockBudget.test.ts the test counts what the twenty sessions hold at the same moment
 * (`pg_locks` without fast-path entries), because the test server may have more connection
 * slots than a stock one. Measured (PostgreSQL 17): 175 entries per session (64 key locks, the
 * policy and lane locks, ~110 ring children and indexes: the count statement alone locks every
 * claims and closures child), 3,500 in all; 143 per session with 0033's 32 keys; the unkeyed
 * claim(64) holds 72 (2026-12-05, after migration 0056: 161 per session, 3,223 in all). The
 * bound is 5/8 of the stock table (4,000), leaving 2,400 entries for every other session;
 * finalize's test (LockBudget.test.ts) keeps to half.
 */
import { TestDatabase } from "@awa/testing"
import { PgClient } from "@effect/sql-pg"
import { assert, describe, it } from "@effect/vitest"
import { Deferred, Effect, Fiber, Layer, Redacted } from "effect"
import { SqlClient } from "effect/sql"
import { KeyGrants } from "../src/KeyGrants.ts"
import { layer as pgGrants } from "../src/PgKeyGrants.ts"
import { layer as pgLayer } from "../src/PgQueueStorage.ts"
import { QueueStorage } from "../src/QueueStorage.ts"
import { dueForAnalyze, fresh, settleStatistics } from "./pgFixtures.ts"

const workers = 20
const keys = 64
/** max_locks_per_transaction (default 64) × max_connections (default 100). */
const stockLockTable = 64 * 100
/** What the twenty keyed claims may hold at once: 5/8 of the stock table. */
const bound = (stockLockTable * 5) / 8

const claimOf = (queue: string, policy: string, max: number) => ({
  queue,
  policy,
  max,
  deadlineMs: 0,
  agingIntervalMs: 0
})

describe("lock budget of the keyed claim", () => {
  it.live(
    `${workers} sessions holding a keyed claim of ${keys} keys at once fit a stock server's lock table`,
    () =>
      Effect.gen(function* () {
        const { url } = yield* TestDatabase.acquire()
        const layerOn = (maxConnections: number) =>
          pgGrants().pipe(
            Layer.provideMerge(pgLayer()),
            Layer.provideMerge(PgClient.layer({ url: Redacted.make(url), maxConnections }))
          )
        const p = fresh("policy")
        const run = fresh("budget")
        // per worker: a queue of `keys` jobs with distinct keys (no two sessions share a lane or a
        // key), and a warm-up queue of two jobs of two keys (a window of one row takes 0056's
        // path, whose statements are not the ones measured)
        yield* Effect.gen(function* () {
          const storage = yield* QueueStorage
          const grants = yield* KeyGrants
          yield* grants.create({ id: p, maxInFlight: 1 })
          for (let w = 0; w < workers; w++) {
            yield* storage.enqueueMany(
              Array.from({ length: keys }, (_, n) => ({
                kind: "b",
                queue: `${run}-${w}`,
                args: { n },
                concurrencyKey: `${w}-${n}`
              }))
            )
            yield* storage.enqueueMany([
              { kind: "b", queue: `${run}-warm-${w}`, args: {}, concurrencyKey: `warm-${w}-a` },
              { kind: "b", queue: `${run}-warm-${w}`, args: {}, concurrencyKey: `warm-${w}-b` }
            ])
          }
        }).pipe(Effect.provide(layerOn(2)))
        // nothing left for autovacuum to analyze while the sessions hold their plans (see
        // LockBudget.test.ts)
        yield* settleStatistics(url)

        const allReported = yield* Deferred.make<void>()
        const reports = yield* Effect.forEach(Array.from({ length: workers }), () => Deferred.make<number>())
        const sessions = yield* Effect.forEach(reports, (report, w) =>
          Effect.gen(function* () {
            const grants = yield* KeyGrants
            const sql = yield* SqlClient.SqlClient
            // a worker's session has claimed before: its plans are cached. In a transaction, so
            // that it runs on this pooled connection, not the layer's own ones (ADR 0033).
            yield* sql.withTransaction(grants.claim(claimOf(`${run}-warm-${w}`, p, 2)))
            yield* sql.withTransaction(
              Effect.gen(function* () {
                const claimed = yield* grants.claim(claimOf(`${run}-${w}`, p, keys))
                assert.strictEqual(claimed._tag === "Claimed" ? claimed.jobs.length : claimed._tag, keys)
                const [held] = yield* sql<{ n: number; advisory: number }>`
                SELECT count(*)::int AS n, count(*) FILTER (WHERE locktype = 'advisory')::int AS advisory
                FROM pg_locks WHERE pid = pg_backend_pid() AND NOT fastpath`
                assert.isAtLeast(held!.advisory, keys, "one advisory lock per key")
                yield* Deferred.succeed(report, held!.n)
                yield* Deferred.await(allReported)
              })
            )
          }).pipe(Effect.provide(layerOn(1)), Effect.forkChild({ startImmediately: true }))
        )
        const held = yield* Effect.forEach(reports, (r) => Deferred.await(r))
        // autovacuum had no reason to analyze a table, and so to invalidate the sessions' plans,
        // while they measured (the warm-ups write two rows per session and table: 40, against at least 50)
        const due = yield* dueForAnalyze(url)
        const total = held.reduce((a, b) => a + b, 0)
        yield* Deferred.succeed(allReported, undefined)
        yield* Effect.forEach(sessions, (s) => Fiber.join(s))
        assert.deepStrictEqual(due, [], "tables due for autovacuum's analyze while the sessions measured")
        yield* Effect.logInfo(
          `keyed lock budget: ${workers} sessions held ${total} shared lock-table entries at once`
        )
        assert.isBelow(
          total,
          bound,
          `the ${workers} sessions held ${total} lock-table entries at once (${held.join(", ")})`
        )
      }).pipe(Effect.scoped)
  )
})
