/**
 * The hot path's cached generic plans read in proportion to the batch, not to the stored rows,
 * also once ANALYZE has seen large ring tables (0015 finalize, 0029 claim). Every hot-path
 * function runs with plan_cache_mode = force_generic_plan: its plans are made once per session
 * from the statistics of that moment, and a plan that is cheapest for the estimated one row can
 * read a whole partition per call. Tuples Postgres counts for the current transaction tell the
 * plans apart without timing anything.
 */

import { TestDatabase } from "@awa/testing"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Layer } from "effect"
import { SqlClient } from "effect/sql"
import { KeyGrants } from "../src/KeyGrants.ts"
import { layer as pgGrants } from "../src/PgKeyGrants.ts"
import { QueueStorage } from "../src/QueueStorage.ts"
import { claimOf, eagerStorage, fresh, withEagerDatabase } from "./pgFixtures.ts"

const ringTables = [
  "ready",
  "claims",
  "closures",
  "terminal",
  "ready_tombstones",
  "claim_marks",
  "claim_spans"
] as const

/**
 * What a call read from each ring table so far in this backend, from its pending (not yet
 * flushed) counts: rows of sequential scans and heap fetches of bitmap scans, counted on the
 * leaf tables, plus the entries every index scan returned, counted on the leaf tables' indexes
 * (an index scan's heap fetches are counted on the index, not on the table, and every hot-path
 * plan is an index scan: without the indexes a whole-lane index walk would read as 0).
 */
const readsSql = `SELECT ${ringTables
  .map(
    (
      t
    ) => `(SELECT coalesce(sum(pg_stat_get_xact_tuples_returned(i.inhrelid) + pg_stat_get_xact_tuples_fetched(i.inhrelid)
                  + (SELECT coalesce(sum(pg_stat_get_xact_tuples_returned(x.indexrelid)), 0) FROM pg_index x WHERE x.indrelid = i.inhrelid)), 0)::int
              FROM pg_inherits i WHERE i.inhparent = 'awa.${t}'::regclass) AS "${t}"`
  )
  .join(", ")}`

type Reads = Record<(typeof ringTables)[number], number>

/** Runs `call` in a transaction and returns what it read from each ring table. */
const readsOf = <A, E, R>(call: Effect.Effect<A, E, R>) =>
  Effect.flatMap(SqlClient.SqlClient, (sql) =>
    sql.withTransaction(
      Effect.gen(function* () {
        // a backend's counts stay pending across transactions until it flushes them: take the difference
        const [before] = yield* sql.unsafe<Reads>(readsSql)
        const result = yield* call
        const [after] = yield* sql.unsafe<Reads>(readsSql)
        const reads = Object.fromEntries(ringTables.map((t) => [t, after![t] - before![t]])) as Reads
        return { result, reads }
      })
    )
  )

const assertBounded = (what: string, reads: Reads, bound: number) => {
  for (const t of ringTables)
    assert.isBelow(reads[t], bound, `${what} read ${reads[t]} tuples of ${t}: ${JSON.stringify(reads)}`)
}

describe("hot-path plans after ANALYZE of large ring tables", () => {
  it.live(
    "claim of several lanes, heartbeat, finalize, rescue and promote read in proportion to their batch",
    () =>
      withEagerDatabase({}, () =>
        Effect.gen(function* () {
          const storage = yield* QueueStorage
          const sql = yield* SqlClient.SqlClient
          const q = fresh("plans")
          // 4,000 queued in three lanes (priorities 1-3), then 2,000 claimed and finalized: large
          // ready, claims, closures and terminal children for ANALYZE to see
          for (const priority of [1, 2, 3])
            yield* storage.enqueueMany(
              Array.from({ length: priority === 2 ? 2000 : 1000 }, (_, n) => ({
                kind: "k",
                queue: q,
                priority,
                args: { n }
              }))
            )
          for (let i = 0; i < 4; i++) {
            const batch = yield* storage.claim(claimOf(q, 500))
            yield* storage.finalizeMany(
              batch.map((c) => ({
                jobId: c.jobId,
                runLease: c.runLease,
                outcome: { _tag: "Complete" as const }
              }))
            )
          }
          yield* sql`ANALYZE awa.ready`
          yield* sql`ANALYZE awa.claims`
          yield* sql`ANALYZE awa.closures`
          yield* sql`ANALYZE awa.terminal`
          yield* sql`ANALYZE awa.claim_marks`
          yield* sql`ANALYZE awa.claim_spans`

          const { result: claimed, reads: claimReads } = yield* readsOf(storage.claim(claimOf(q, 5)))
          assert.strictEqual(claimed.length, 5)
          assertBounded("claim(5) of 3 lanes", claimReads, 100)

          const { reads: heartbeatReads } = yield* readsOf(
            storage.heartbeatMany(claimed.map((c) => ({ jobId: c.jobId, runLease: c.runLease })))
          )
          assertBounded("heartbeat(5)", heartbeatReads, 100)

          const { result: finalized, reads: finalizeReads } = yield* readsOf(
            storage.finalizeMany(
              claimed.map((c) => ({
                jobId: c.jobId,
                runLease: c.runLease,
                outcome: { _tag: "Complete" as const }
              }))
            )
          )
          assert.deepStrictEqual(
            finalized.map((f) => f._tag),
            ["Applied", "Applied", "Applied", "Applied", "Applied"]
          )
          assertBounded("finalize(5)", finalizeReads, 100)

          // the leader's periodic reads: nothing stale, nothing past its deadline, nothing due
          const { result: stale, reads: staleReads } = yield* readsOf(
            storage.rescueStale({ stalenessMs: 3_600_000, limit: 500 })
          )
          assert.strictEqual(stale.length, 0)
          assertBounded("rescue of stale attempts", staleReads, 100)
          const { reads: deadlineReads } = yield* readsOf(storage.rescueDeadlines(500))
          assertBounded("rescue of deadlines", deadlineReads, 100)
          const { reads: promoteReads } = yield* readsOf(storage.promoteDue(500))
          assertBounded("promote", promoteReads, 100)
        })
      )
  )

  it.live(
    "the keyed claim (0033) reads its window and the claimed keys' retained grants, not the stored rows",
    () =>
      Effect.flatMap(TestDatabase.acquire(), ({ url }) =>
        Effect.gen(function* () {
          const storage = yield* QueueStorage
          const grants = yield* KeyGrants
          const sql = yield* SqlClient.SqlClient
          const q = fresh("plans-keyed")
          const p = fresh("policy")
          yield* grants.create({ id: p, maxInFlight: 1000 })
          // 4,000 keyed jobs over 400 keys in three lanes, 2,000 claimed and finalized: every key
          // has about 5 closed grants in the retained slots
          for (const priority of [1, 2, 3])
            yield* storage.enqueueMany(
              Array.from({ length: priority === 2 ? 2000 : 1000 }, (_, n) => ({
                kind: "k",
                queue: q,
                priority,
                args: { n },
                concurrencyKey: `key-${n % 400}`
              }))
            )
          for (let i = 0; i < 40; i++) {
            const batch = yield* grants.claim({
              queue: q,
              policy: p,
              max: 50,
              deadlineMs: 0,
              agingIntervalMs: 0
            })
            assert.strictEqual(batch._tag, "Claimed")
            if (batch._tag !== "Claimed") return
            yield* storage.finalizeMany(
              batch.jobs.map((c) => ({
                jobId: c.jobId,
                runLease: c.runLease,
                outcome: { _tag: "Complete" as const }
              }))
            )
          }
          yield* sql`ANALYZE awa.ready`
          yield* sql`ANALYZE awa.claims`
          yield* sql`ANALYZE awa.closures`
          yield* sql`ANALYZE awa.terminal`
          yield* sql`ANALYZE awa.claim_marks`
          yield* sql`ANALYZE awa.claim_spans`
          const { result, reads } = yield* readsOf(
            grants.claim({ queue: q, policy: p, max: 5, deadlineMs: 0, agingIntervalMs: 0 })
          )
          assert.strictEqual(result._tag === "Claimed" ? result.jobs.length : 0, 5)
          // window of 5 and 5 keys with ~5 retained grants each (claims and closure probes)
          assertBounded("claim_keyed(5) of 3 lanes", reads, 100)
        }).pipe(Effect.provide(pgGrants().pipe(Layer.provideMerge(eagerStorage(url, 1)))))
      )
  )
})
