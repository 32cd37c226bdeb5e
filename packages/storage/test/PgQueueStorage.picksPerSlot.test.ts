/**
 * Migrations 0063 and 0064 (ADR 0044): claim's pick, and a completion's reads of its batch's
 * closures and ready rows, read each slot through that slot's own function, whose statement names
 * the slot's children, instead of one statement over the partitioned parents. What would break
 * without them, or with them done wrong:
 *
 * - the plan over the parents names all sixteen children of `ready` and `ready_tombstones`, and a
 *   generic plan locks every child it names at each execution (PostgreSQL 14–18): a claim held
 *   ACCESS SHARE on all thirty-two. Seen to fail on 0062: sixteen of each. A completion, the same
 *   with `closures` (seen to fail on 0063).
 * - migration 0065: a claim that finds its one lane's claim lock held asks whether the lane has a
 *   claimable head before it waits; the probe read the three parents without slot bounds (all
 *   forty-eight children locked; seen to fail on 0064: sixteen `ready` and sixteen
 *   `ready_tombstones` children). It reads the live slots, oldest first, and stops at the head.
 * - migration 0066: a claim of a queue with several lanes ranks them by their heads; the ranking
 *   read the heads through the `ready` and `ready_tombstones` parents (seen to fail on 0065: all
 *   thirty-two children locked). A lane's head in an older live slot must still rank it.
 * - migration 0067: claim_keyed's ranking, busy-lane probe and window read the same way (seen to
 *   fail on 0066: all thirty-two children locked).
 * - a lane whose rows lie in two live slots, a carried row sitting in the current slot before the
 *   older slot's rows: the slots' candidates must be merged in lane order and cut to the limit,
 *   or the claim takes later jobs first and its mark passes the carried ones.
 */
import { TestDatabase } from "@awa/testing"
import { assert, describe, it } from "@effect/vitest"
import { Deferred, Effect, Fiber } from "effect"
import { SqlClient } from "effect/sql"
import { KeyGrants } from "../src/KeyGrants.ts"
import type { ClaimedJob } from "../src/QueueStorage.ts"
import { QueueStorage } from "../src/QueueStorage.ts"
import {
  claimOf,
  completeAll,
  eagerGrants,
  eagerStorage,
  fresh,
  holdOpenUntil,
  keepNothing
} from "./pgFixtures.ts"

const job = (queue: string, name: string) => ({ kind: "slots", queue, args: { name } })

const names = (rows: ReadonlyArray<ClaimedJob>) => rows.map((r) => (r.args as { name: string }).name)

/** The ring children matching `pattern` that the current transaction holds a lock on, in any mode. */
const lockedChildren = (pattern: string) =>
  Effect.flatMap(
    SqlClient.SqlClient,
    (sql) => sql<{ relation: string }>`
      SELECT DISTINCT c.relname AS relation FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
      WHERE l.pid = pg_backend_pid() AND l.locktype = 'relation' AND c.relname ~ ${pattern}
      ORDER BY 1`
  ).pipe(Effect.map((rows) => rows.map((r) => r.relation)))

const readyChildren = "^ready(_tombstones)?_[0-9]+$"

/** `statement`'s rows in a transaction of their own, with the `ready` children it left locked. */
const rowsAndReadyLocks = <A>(statement: Effect.Effect<ReadonlyArray<A>, unknown, SqlClient.SqlClient>) =>
  Effect.flatMap(SqlClient.SqlClient, (sql) =>
    sql.withTransaction(
      Effect.gen(function* () {
        const rows = yield* statement
        return { rows, locked: yield* lockedChildren(readyChildren) }
      })
    )
  )

/** The `ready` and `ready_tombstones` children of `slots`, in the order `lockedChildren` gives. */
const readyChildrenOf = (slots: ReadonlyArray<{ readonly slot: number }>) =>
  slots
    .flatMap(({ slot }) => [`ready_${slot}`, `ready_tombstones_${slot}`])
    .sort((x, y) => (x < y ? -1 : x > y ? 1 : 0))

/** `body` while another session holds lane `(queue, 2, 0)`'s claim lock, as a claim in flight does. */
const whileLaneHeld = <A, E, R>(url: string, queue: string, body: Effect.Effect<A, E, R>) =>
  Effect.gen(function* () {
    const release = yield* Deferred.make<void>()
    const holder = yield* holdOpenUntil(
      url,
      `SELECT pg_advisory_xact_lock(awa.lock_ns('claim'), awa.lane_key('${queue}', 2, 0))`,
      release
    )
    const result = yield* body
    yield* Deferred.succeed(release, undefined)
    yield* Fiber.join(holder)
    return result
  })

describe("reads slot by slot (0063 to 0067)", () => {
  it.live("a claim locks the ready and tombstone children of its live slot only", () =>
    Effect.gen(function* () {
      const { url } = yield* TestDatabase.acquire()
      const q = fresh("locks")
      yield* Effect.gen(function* () {
        const storage = yield* QueueStorage
        const sql = yield* SqlClient.SqlClient
        yield* storage.enqueueMany([job(q, "a"), job(q, "b")])
        const locked = yield* sql.withTransaction(
          Effect.gen(function* () {
            const claimed = yield* sql<{ job_id: string }>`SELECT job_id FROM awa.claim(${q}, 1, 0, 0)`
            assert.strictEqual(claimed.length, 1)
            return yield* lockedChildren(readyChildren)
          })
        )
        const [current] = yield* sql<{ slot: number }>`SELECT slot FROM awa.ring_current('queue')`
        assert.deepStrictEqual(locked, [`ready_${current!.slot}`, `ready_tombstones_${current!.slot}`])
      }).pipe(Effect.provide(eagerStorage(url, 1)))
    })
  )

  it.live(
    "a claim that finds its one lane busy probes the live slots' children only, oldest first, and sees a head there",
    () =>
      Effect.gen(function* () {
        const { url } = yield* TestDatabase.acquire()
        const q = fresh("probe")
        yield* Effect.gen(function* () {
          const storage = yield* QueueStorage
          const sql = yield* SqlClient.SqlClient
          // the lane's rows in an older live slot, the current one empty
          yield* storage.enqueueMany([job(q, "a"), job(q, "b")])
          assert.strictEqual(yield* storage.rotate, "Rotated")
          const [older] = yield* sql<{ slot: number }>`SELECT DISTINCT slot FROM awa.ready WHERE queue = ${q}`
          const [current] = yield* sql<{ slot: number }>`SELECT slot FROM awa.ring_current('queue')`
          assert.notStrictEqual(older!.slot, current!.slot)
          // another claimer holds the lane's claim lock to the end of the test: this claim probes,
          // waits its 100 ms and gives the lane up (claiming nothing, so the pick never runs and
          // what it locked is the probe's)
          const { rows: claimed, locked } = yield* whileLaneHeld(
            url,
            q,
            rowsAndReadyLocks(sql<{ job_id: string }>`SELECT job_id FROM awa.claim(${q}, 1, 0, 0)`)
          )
          assert.strictEqual(claimed.length, 0, "the lane stayed busy")
          assert.deepStrictEqual(
            locked,
            [`ready_${older!.slot}`, `ready_tombstones_${older!.slot}`],
            "the probe read the oldest live slot, found the head there and stopped"
          )
          assert.deepStrictEqual(names(yield* storage.claim(claimOf(q, 10))), ["a", "b"])
        }).pipe(Effect.provide(eagerStorage(url, 2)))
      })
  )

  it.live(
    "a claim of several lanes ranks them by heads read in the live slots' children only, an older slot's head included",
    () =>
      Effect.gen(function* () {
        const { url } = yield* TestDatabase.acquire()
        const q = fresh("ranking")
        yield* Effect.gen(function* () {
          const storage = yield* QueueStorage
          const sql = yield* SqlClient.SqlClient
          // priority 2's head "a" in an older slot; then priority 1's "b" and priority 2's "c" in
          // the current one
          yield* storage.enqueueMany([{ ...job(q, "a"), priority: 2 }])
          assert.strictEqual(yield* storage.rotate, "Rotated")
          yield* storage.enqueueMany([
            { ...job(q, "b"), priority: 1 },
            { ...job(q, "c"), priority: 2 }
          ])
          const slots = yield* sql<{ slot: number }>`
            SELECT DISTINCT slot FROM awa.ready WHERE queue = ${q} ORDER BY slot`
          assert.strictEqual(slots.length, 2)
          // aging of 1 ms: both lanes age to priority 1 and rank by their heads' run_at, so the
          // lane of "a" (the oldest job) goes first, which only its head in the older slot shows
          const { rows: claimed, locked } = yield* rowsAndReadyLocks(
            sql<{ name: string }>`SELECT args->>'name' AS name FROM awa.claim(${q}, 3, 0, 1)`
          )
          assert.deepStrictEqual(
            claimed.map((r) => r.name),
            ["a", "c", "b"]
          )
          assert.deepStrictEqual(locked, readyChildrenOf(slots))
        }).pipe(Effect.provide(eagerStorage(url, 1)))
      })
  )

  it.live(
    "a keyed claim ranks, windows and merges its lanes from the live slots' children only, in lane order",
    () =>
      Effect.gen(function* () {
        const { url } = yield* TestDatabase.acquire()
        const q = fresh("keyed")
        yield* Effect.gen(function* () {
          const storage = yield* QueueStorage
          const grants = yield* KeyGrants
          const sql = yield* SqlClient.SqlClient
          const policy = fresh("policy")
          yield* grants.create({ id: policy, maxInFlight: 10 })
          const keyed = (name: string, priority: number) => ({
            ...job(q, name),
            priority,
            concurrencyKey: name
          })
          // priority 2's lane: a1, a2 in an older slot, a3 in the current one; priority 1's b there
          yield* storage.enqueueMany([keyed("a1", 2), keyed("a2", 2)])
          assert.strictEqual(yield* storage.rotate, "Rotated")
          yield* storage.enqueueMany([keyed("b", 1), keyed("a3", 2)])
          const slots = yield* sql<{ slot: number }>`
            SELECT DISTINCT slot FROM awa.ready WHERE queue = ${q} ORDER BY slot`
          assert.strictEqual(slots.length, 2)
          // aging of 1 ms: the lanes rank by their heads' run_at, a1's lane first (its head is in
          // the older slot); its window spans both slots
          const { rows: claimed, locked } = yield* rowsAndReadyLocks(
            sql<{ name: string }>`
              SELECT args->>'name' AS name FROM awa.claim_keyed(${q}, ${policy}, 10, 0, 1) WHERE job_id IS NOT NULL`
          )
          assert.deepStrictEqual(
            claimed.map((r) => r.name),
            ["a1", "a2", "a3", "b"]
          )
          assert.deepStrictEqual(locked, readyChildrenOf(slots))
        }).pipe(Effect.provide(eagerGrants(url, 1)))
      })
  )

  it.live("a keyed claim that finds its one lane busy probes the oldest live slot's children only", () =>
    Effect.gen(function* () {
      const { url } = yield* TestDatabase.acquire()
      const q = fresh("keyed-probe")
      yield* Effect.gen(function* () {
        const storage = yield* QueueStorage
        const grants = yield* KeyGrants
        const sql = yield* SqlClient.SqlClient
        const policy = fresh("policy")
        yield* grants.create({ id: policy, maxInFlight: 10 })
        yield* storage.enqueueMany([
          { ...job(q, "a"), concurrencyKey: "a" },
          { ...job(q, "b"), concurrencyKey: "b" }
        ])
        assert.strictEqual(yield* storage.rotate, "Rotated")
        const [older] = yield* sql<{ slot: number }>`SELECT DISTINCT slot FROM awa.ready WHERE queue = ${q}`
        const { rows: claimed, locked } = yield* whileLaneHeld(
          url,
          q,
          rowsAndReadyLocks(
            sql<{ job_id: string | null; gate: string | null }>`
              SELECT job_id, gate FROM awa.claim_keyed(${q}, ${policy}, 1, 0, 0)`
          )
        )
        assert.deepStrictEqual(
          claimed,
          [{ job_id: null, gate: "keyLockContended" }],
          "the probe saw the head in the older slot: the busy lane is reported contended, not idle"
        )
        assert.deepStrictEqual(locked, [`ready_${older!.slot}`, `ready_tombstones_${older!.slot}`])
      }).pipe(Effect.provide(eagerGrants(url, 2)))
    })
  )

  it.live(
    "a lane in two live slots, carried rows in the current one before the older slot's: claimed in lane order, cut to the limit, none skipped",
    () =>
      Effect.gen(function* () {
        const { url } = yield* TestDatabase.acquire()
        const q = fresh("merge")
        yield* Effect.gen(function* () {
          const storage = yield* QueueStorage
          const sql = yield* SqlClient.SqlClient
          // slot S0: a1 claimed and completed, a2 and a3 left; a rotation to S1, which gets b4, b5;
          // a rotation to S2 and a prune of S0, which carries a2 and a3 into S2
          yield* storage.enqueueMany([job(q, "a1"), job(q, "a2"), job(q, "a3")])
          yield* completeAll(yield* storage.claim(claimOf(q, 1)))
          assert.strictEqual(yield* storage.rotate, "Rotated")
          yield* storage.enqueueMany([job(q, "b4"), job(q, "b5")])
          assert.strictEqual(yield* storage.rotate, "Rotated")
          assert.strictEqual((yield* storage.prune(keepNothing))._tag, "Pruned")
          const layout = yield* sql<{ slot: number; name: string }>`
            SELECT r.slot, r.args->>'name' AS name FROM awa.ready r WHERE r.queue = ${q} ORDER BY r.lane_seq`
          const [s1, s2] = [layout[2]!.slot, layout[0]!.slot]
          assert.notStrictEqual(s1, s2)
          assert.deepStrictEqual(
            layout.map((r) => `${r.name}@${r.slot === s2 ? "current" : "older"}`),
            ["a2@current", "a3@current", "b4@older", "b5@older"],
            "the carried rows lie in the current slot, before the older slot's"
          )

          assert.deepStrictEqual(names(yield* storage.claim(claimOf(q, 3))), ["a2", "a3", "b4"])
          yield* storage.enqueueMany([job(q, "c6")])
          assert.deepStrictEqual(names(yield* storage.claim(claimOf(q, 10))), ["b5", "c6"])
          assert.deepStrictEqual(names(yield* storage.claim(claimOf(q, 10))), [])
        }).pipe(Effect.provide(eagerStorage(url, 1)))
      })
  )

  it.live(
    "a completion locks the closures child of its claims' slot only, and still answers a closed attempt as stale",
    () =>
      Effect.gen(function* () {
        const { url } = yield* TestDatabase.acquire()
        const q = fresh("closures")
        yield* Effect.gen(function* () {
          const storage = yield* QueueStorage
          const sql = yield* SqlClient.SqlClient
          yield* storage.enqueueMany([job(q, "a"), job(q, "b")])
          const claimed = yield* storage.claim(claimOf(q, 2))
          assert.strictEqual(claimed.length, 2)
          const [a, b] = claimed
          yield* completeAll([a!])
          const { answers, locked } = yield* sql.withTransaction(
            Effect.gen(function* () {
              const answers = yield* sql<{ applied: boolean }>`
              SELECT applied FROM awa.finalize_completions(
                ${[a!.jobId, b!.jobId]}::bigint[], ${[a!.runLease, b!.runLease]}::bigint[]) ORDER BY ord`
              return {
                answers: answers.map((r) => r.applied),
                locked: yield* lockedChildren("^closures_[0-9]+$")
              }
            })
          )
          const [current] = yield* sql<{ slot: number }>`SELECT slot FROM awa.ring_current('queue')`
          assert.deepStrictEqual(
            answers,
            [false, true],
            "a's attempt was closed already: stale; b's completes"
          )
          assert.deepStrictEqual(locked, [`closures_${current!.slot}`])
        }).pipe(Effect.provide(eagerStorage(url, 1)))
      })
  )
})
