/**
 * Key grants on Postgres where transactions and connections matter (capabilities.md §23,
 * migration 0033): racing claimers, a rolled-back claim, rescue, and prune carrying an open grant.
 */
import { TestDatabase } from "@awa/testing"
import { assert, describe, it } from "@effect/vitest"
import { Deferred, Effect, Fiber, Layer } from "effect"
import { SqlClient } from "effect/sql"
import { type KeyedClaim, KeyGrants } from "../src/KeyGrants.ts"
import { layer as pgGrants } from "../src/PgKeyGrants.ts"
import { QueueStorage } from "../src/QueueStorage.ts"
import { eagerStorage, fresh, holdOpenUntil, keepAll } from "./pgFixtures.ts"

const withGrants = <A, E>(
  body: (url: string) => Effect.Effect<A, E, QueueStorage | KeyGrants | SqlClient.SqlClient>
) =>
  Effect.flatMap(TestDatabase.acquire(), ({ url }) =>
    body(url).pipe(Effect.provide(pgGrants().pipe(Layer.provideMerge(eagerStorage(url, 3)))))
  )

const claimOf = (queue: string, policy: string, max = 10, deadlineMs = 0) => ({
  queue,
  policy,
  max,
  deadlineMs,
  agingIntervalMs: 0
})
const count = (c: KeyedClaim) => (c._tag === "Claimed" ? c.jobs.length : 0)

describe("PgKeyGrants races", () => {
  it.live(
    "two claimers at limit 1: the second waits out the first's key lock and finds the key gated; one grant",
    () =>
      withGrants((url) =>
        Effect.gen(function* () {
          const storage = yield* QueueStorage
          const grants = yield* KeyGrants
          const q = fresh("race")
          const p = fresh("policy")
          yield* grants.create({ id: p, maxInFlight: 1 })
          // one job of the key in each of two lanes: the claimers can take different lanes
          yield* storage.enqueueMany([
            { kind: "k", queue: q, args: {}, priority: 1, concurrencyKey: "t" },
            { kind: "k", queue: q, args: {}, priority: 2, concurrencyKey: "t" }
          ])
          // claimer A: claimed, not yet committed (its lane and key locks held)
          const release = yield* Deferred.make<void>()
          const a = yield* holdOpenUntil(
            url,
            `SELECT * FROM awa.claim_keyed('${q}', '${p}', 1, 0, 0)`,
            release
          )
          // claimer B: lane 1 is A's, lane 2's key is A's: contended, nothing claimed
          assert.strictEqual((yield* grants.claim(claimOf(q, p)))._tag, "KeyLockContended")
          yield* Deferred.succeed(release, undefined)
          yield* Fiber.join(a)
          // A committed its grant: B sees the key at its limit
          assert.strictEqual((yield* grants.claim(claimOf(q, p)))._tag, "KeyGated")
          assert.strictEqual(yield* grants.openGrants(p, "t"), 1)
        })
      ),
    60_000
  )

  it.live(
    "six claimers on their own connections race over four lanes of one key at limit 1: one grant",
    () =>
      withGrants((url) =>
        Effect.gen(function* () {
          const storage = yield* QueueStorage
          const grants = yield* KeyGrants
          const q = fresh("race-many")
          const p = fresh("policy")
          yield* grants.create({ id: p, maxInFlight: 1 })
          yield* storage.enqueueMany(
            Array.from({ length: 40 }, (_, i) => ({
              kind: "k",
              queue: q,
              args: {},
              priority: 1 + (i % 4),
              concurrencyKey: "one"
            }))
          )
          const claimer = Effect.gen(function* () {
            const g = yield* KeyGrants
            let got = 0
            for (let i = 0; i < 20; i++) got += count(yield* g.claim(claimOf(q, p, 5)))
            return got
          }).pipe(Effect.provide(pgGrants().pipe(Layer.provideMerge(eagerStorage(url, 1)))))
          const got = yield* Effect.all(
            Array.from({ length: 6 }, () => claimer),
            { concurrency: "unbounded" }
          )
          assert.strictEqual(
            got.reduce((x, y) => x + y, 0),
            1
          )
          assert.strictEqual(yield* grants.openGrants(p, "one"), 1)
        })
      ),
    60_000
  )

  it.live("a rolled-back claim creates no grant", () =>
    withGrants(() =>
      Effect.gen(function* () {
        const storage = yield* QueueStorage
        const grants = yield* KeyGrants
        const sql = yield* SqlClient.SqlClient
        const q = fresh("rollback")
        const p = fresh("policy")
        yield* grants.create({ id: p, maxInFlight: 1 })
        yield* storage.enqueueMany([{ kind: "k", queue: q, args: {}, concurrencyKey: "r" }])
        const inside = yield* sql
          .withTransaction(
            Effect.gen(function* () {
              const claimed = yield* grants.claim(claimOf(q, p))
              assert.strictEqual(count(claimed), 1)
              assert.strictEqual(yield* grants.openGrants(p, "r"), 1)
              return yield* Effect.fail("roll back" as const)
            })
          )
          .pipe(Effect.flip)
        assert.strictEqual(inside, "roll back")
        assert.strictEqual(yield* grants.openGrants(p, "r"), 0)
        assert.strictEqual(count(yield* grants.claim(claimOf(q, p))), 1)
      })
    )
  )

  it.live("a rescued attempt's grant is closed (deadline rescue)", () =>
    withGrants(() =>
      Effect.gen(function* () {
        const storage = yield* QueueStorage
        const grants = yield* KeyGrants
        const q = fresh("rescue")
        const p = fresh("policy")
        yield* grants.create({ id: p, maxInFlight: 1 })
        yield* storage.enqueueMany([
          { kind: "k", queue: q, args: {}, concurrencyKey: "d" },
          { kind: "k", queue: q, args: {}, concurrencyKey: "d" }
        ])
        const first = yield* grants.claim(claimOf(q, p, 10, 1))
        const held = first._tag === "Claimed" ? first.jobs[0] : undefined
        assert.strictEqual(yield* grants.openGrants(p, "d"), 1)
        // wait for the rescue sweep to find the (1 ms) deadline passed
        let rescued = 0
        while (rescued === 0) {
          rescued = (yield* storage.rescueDeadlines(100)).filter((r) => r.jobId === held!.jobId).length
        }
        assert.strictEqual(yield* grants.openGrants(p, "d"), 0)
        assert.strictEqual(count(yield* grants.claim(claimOf(q, p))), 1)
      })
    )
  )

  it.live("prune carries an open grant forward with its key", () =>
    withGrants(() =>
      Effect.gen(function* () {
        const storage = yield* QueueStorage
        const grants = yield* KeyGrants
        const sql = yield* SqlClient.SqlClient
        const q = fresh("carry")
        const p = fresh("policy")
        yield* grants.create({ id: p, maxInFlight: 1 })
        yield* storage.enqueueMany([
          { kind: "k", queue: q, args: {}, concurrencyKey: "c" },
          { kind: "k", queue: q, args: {}, concurrencyKey: "c" }
        ])
        assert.strictEqual(count(yield* grants.claim(claimOf(q, p))), 1)
        const [before] = yield* sql<{ slot: number }>`SELECT slot FROM awa.claims WHERE key_policy = ${p}`
        assert.strictEqual(yield* storage.rotateWhenDue({ minRows: 1, maxAgeMs: 0 }), "Rotated")
        let outcome = yield* storage.prune({ ...keepAll, carryAfterMs: 0 })
        while (outcome._tag !== "Pruned") outcome = yield* storage.prune({ ...keepAll, carryAfterMs: 0 })
        assert.isTrue(outcome.carried >= 1)
        const after = yield* sql<{ slot: number }>`SELECT slot FROM awa.claims WHERE key_policy = ${p}`
        assert.strictEqual(after.length, 1)
        assert.notStrictEqual(after[0]!.slot, before!.slot)
        assert.strictEqual(yield* grants.openGrants(p, "c"), 1)
        assert.strictEqual((yield* grants.claim(claimOf(q, p)))._tag, "KeyGated")
      })
    )
  )
})
