/**
 * Migration 0047: claim reads its lane's cursor in the live slots only, with the slot ranges read
 * before the cursor statement. A rotation and a prune that commit between the two can carry the
 * lane's cursor (and its unclaimed rows) into a slot the ranges do not hold; the cursor statement
 * sees the newer generation and reads both again. Without that re-read the claim would take the
 * jobs enqueued after the carried ones and mark past them: the carried jobs would never run.
 *
 * The interleaving is forced, not hoped for: the rotation and the prune run in one transaction
 * held open, the claim starts, reads its ranges (the rotation is not committed yet) and waits in
 * its cursor statement for the prune's exclusive lock on claim_marks; then the prune commits.
 * Seen to fail with either function's re-read removed: both then returned [b4, b5], and a2 and
 * a3 lay below the new mark.
 */
import { TestDatabase } from "@awa/testing"
import { assert, describe, it } from "@effect/vitest"
import { Deferred, Effect, Fiber } from "effect"
import { SqlClient } from "effect/sql"
import { KeyGrants } from "../src/KeyGrants.ts"
import type { ClaimedJob } from "../src/QueueStorage.ts"
import { QueueStorage } from "../src/QueueStorage.ts"
import {
  claimers,
  claimOf,
  completeAll,
  eagerGrants,
  eagerStorage,
  fresh,
  keepNothing
} from "./pgFixtures.ts"

const job = (queue: string, name: string) => ({ kind: "cursor", queue, args: { name }, concurrencyKey: name })

const names = (rows: ReadonlyArray<ClaimedJob>) => rows.map((r) => (r.args as { name: string }).name)

const policyOf = (q: string) => `${q}-policy`

/** The two claims that read a lane's cursor, returning the jobs' names (the keyed one under a policy no key reaches). */
const claimNames = (claimer: keyof typeof claimers, q: string) =>
  Effect.map(claimers[claimer](q, policyOf(q), 10), names)

const session = (url: string) => eagerGrants(url, 1)

/** Waits until some session of this database waits for a relation lock. */
const untilRelationLockWaiter = Effect.gen(function* () {
  const sql = yield* SqlClient.SqlClient
  const waiting = sql<{ n: number }>`
    SELECT count(*)::int AS n FROM pg_locks l JOIN pg_database d ON d.oid = l.database
    WHERE d.datname = current_database() AND l.locktype = 'relation' AND NOT l.granted`
  while ((yield* waiting)[0]!.n === 0) yield* Effect.sleep("5 millis")
})

describe("claim's cursor in the live slots (0047)", () => {
  it.live.each(Object.keys(claimers) as Array<keyof typeof claimers>)(
    "%s: a rotation and a carrying prune committed between its slot ranges and its cursor: the carried jobs are claimed first, none is skipped",
    (claimer) =>
      Effect.gen(function* () {
        const { url } = yield* TestDatabase.acquire()
        const q = fresh("cursor")
        // slot S0: a1 claimed and completed (the lane's mark lies in S0), a2 and a3 left unclaimed;
        // then a rotation to S1, which gets b4 and b5
        yield* Effect.gen(function* () {
          const storage = yield* QueueStorage
          const sql = yield* SqlClient.SqlClient
          yield* (yield* KeyGrants).create({ id: policyOf(q), maxInFlight: 100 })
          yield* storage.enqueueMany([job(q, "a1"), job(q, "a2"), job(q, "a3")])
          const first = yield* storage.claim(claimOf(q, 1))
          assert.deepStrictEqual(names(first), ["a1"])
          yield* completeAll(first)
          assert.strictEqual(yield* storage.rotate, "Rotated")
          yield* storage.enqueueMany([job(q, "b4"), job(q, "b5")])
          const slots = yield* sql<{ n: number }>`SELECT count(DISTINCT slot)::int AS n FROM awa.ready`
          assert.strictEqual(slots[0]!.n, 2, "the lane's rows lie in two slots")
        }).pipe(Effect.provide(session(url)))

        // one transaction: rotate to S2 and prune S0, which carries a2, a3 and the lane's cursor
        // into S2; held open until the claim below waits for its locks
        const pruned = yield* Deferred.make<{ readonly marks: string; readonly carried: string }>()
        const commit = yield* Deferred.make<void>()
        const pruner = yield* Effect.gen(function* () {
          const storage = yield* QueueStorage
          const sql = yield* SqlClient.SqlClient
          yield* sql.withTransaction(
            Effect.gen(function* () {
              assert.strictEqual(yield* storage.rotate, "Rotated")
              const outcome = yield* storage.prune(keepNothing)
              assert.strictEqual(outcome._tag, "Pruned")
              // what the prune left, seen inside its transaction: the lane's cursor and a2, a3 in
              // the new current slot, which the claim's ranges will not hold
              const [state] = yield* sql<{ marks: string; carried: string }>`
                SELECT (SELECT string_agg(m.slot || ':' || m.next_lane_seq, ',') FROM awa.claim_marks m
                        WHERE m.queue = ${q}) AS marks,
                       (SELECT string_agg(r.slot || ':' || r.lane_seq, ',' ORDER BY r.lane_seq) FROM awa.ready r
                        WHERE r.queue = ${q} AND r.slot = (SELECT c.slot FROM awa.ring_current('queue') c)) AS carried`
              yield* Deferred.succeed(pruned, state!)
              yield* Deferred.await(commit)
            })
          )
        }).pipe(Effect.provide(eagerStorage(url, 1)), Effect.forkChild({ startImmediately: true }))
        assert.deepStrictEqual(yield* Deferred.await(pruned), { marks: "2:2", carried: "2:2,2:3" })

        const claiming = yield* claimNames(claimer, q).pipe(
          Effect.provide(session(url)),
          Effect.forkChild({ startImmediately: true })
        )
        yield* untilRelationLockWaiter.pipe(Effect.provide(eagerStorage(url, 1)))
        yield* Deferred.succeed(commit, undefined)
        yield* Fiber.join(pruner)
        assert.deepStrictEqual(yield* Fiber.join(claiming), ["a2", "a3", "b4", "b5"])
      })
  )
})
