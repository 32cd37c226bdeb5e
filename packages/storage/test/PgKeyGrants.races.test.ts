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

/** The lock a key's claimers take (claim_keyed: the digest's first 32 bits). */
const keyLockOf = (key: string) =>
  `(SELECT awa.lock_ns('key') AS ns, (get_byte(d, 0) << 24) | (get_byte(d, 1) << 16) | (get_byte(d, 2) << 8) | get_byte(d, 3) AS id
    FROM (SELECT awa.key_digest('${key}') AS d) k)`

/** Two one-lane queues under a new policy at limit 1; the first holds one job of key "t". */
const twoQueuesOfKeyT = (prefix: string) =>
  Effect.gen(function* () {
    const q1 = fresh(`${prefix}-a`)
    const q2 = fresh(`${prefix}-b`)
    const p = fresh("policy")
    yield* (yield* KeyGrants).create({ id: p, maxInFlight: 1 })
    yield* (yield* QueueStorage).enqueueMany([{ kind: "k", queue: q1, args: {}, concurrencyKey: "t" }])
    return { q1, q2, p }
  })

describe("a keyed claim of one row (migration 0056)", () => {
  it.live(
    "two one-lane queues of one key at limit 1: contended, then gated, then claimed after the closure",
    () =>
      withGrants((url) =>
        Effect.gen(function* () {
          const storage = yield* QueueStorage
          const grants = yield* KeyGrants
          const sql = yield* SqlClient.SqlClient
          const { q1, q2, p } = yield* twoQueuesOfKeyT("one-row")
          yield* storage.enqueueMany([{ kind: "k", queue: q2, args: {}, concurrencyKey: "t" }])
          // A: q1's one row claimed, not yet committed (its key's lock held)
          const release = yield* Deferred.make<void>()
          const a = yield* holdOpenUntil(
            url,
            `SELECT * FROM awa.claim_keyed('${q1}', '${p}', 1, 0, 0)`,
            release
          )
          assert.strictEqual((yield* grants.claim(claimOf(q2, p)))._tag, "KeyLockContended")
          yield* Deferred.succeed(release, undefined)
          yield* Fiber.join(a)
          // A's grant committed: the count, after the lock, sees it
          assert.strictEqual((yield* grants.claim(claimOf(q2, p)))._tag, "KeyGated")
          assert.strictEqual(yield* grants.openGrants(p, "t"), 1)
          // nothing written for the gated claim
          const [claims] = yield* sql<{
            n: number
          }>`SELECT count(*)::int AS n FROM awa.claims WHERE queue = ${q2}`
          assert.strictEqual(claims!.n, 0)
          const [held] = yield* sql<{ job_id: bigint; run_lease: bigint }>`
          SELECT job_id, run_lease FROM awa.claims WHERE queue = ${q1}`
          yield* storage.finalizeMany([
            { jobId: held!.job_id, runLease: held!.run_lease, outcome: { _tag: "Complete" } }
          ])
          const claimed = yield* grants.claim(claimOf(q2, p))
          assert.strictEqual(count(claimed), 1)
          assert.strictEqual(yield* grants.openGrants(p, "t"), 1)
        })
      )
  )

  it.live(
    "claimers of one-row windows race over eight one-lane queues of one key at limit 2: two grants",
    () =>
      withGrants((url) =>
        Effect.gen(function* () {
          const storage = yield* QueueStorage
          const grants = yield* KeyGrants
          const queues = Array.from({ length: 8 }, (_, i) => fresh(`one-row-race-${i}`))
          const p = fresh("policy")
          yield* grants.create({ id: p, maxInFlight: 2 })
          for (const q of queues)
            yield* storage.enqueueMany(
              Array.from({ length: 5 }, () => ({ kind: "k", queue: q, args: {}, concurrencyKey: "one" }))
            )
          // max 1: every window is one row
          const claimer = (offset: number) =>
            Effect.gen(function* () {
              const g = yield* KeyGrants
              let got = 0
              for (let i = 0; i < 24; i++)
                got += count(yield* g.claim(claimOf(queues[(i + offset) % 8]!, p, 1)))
              return got
            }).pipe(Effect.provide(pgGrants().pipe(Layer.provideMerge(eagerStorage(url, 1)))))
          const got = yield* Effect.all(
            Array.from({ length: 6 }, (_, c) => claimer(c)),
            { concurrency: "unbounded" }
          )
          assert.strictEqual(
            got.reduce((x, y) => x + y, 0),
            2
          )
          assert.strictEqual(yield* grants.openGrants(p, "one"), 2)
        })
      )
  )

  it.live(
    "a rotation between a claimer's slot ranges and its count: a grant in the new slot is counted",
    () =>
      withGrants((url) =>
        Effect.gen(function* () {
          const storage = yield* QueueStorage
          const grants = yield* KeyGrants
          const sql = yield* SqlClient.SqlClient
          const { q1, q2, p } = yield* twoQueuesOfKeyT("rotated")
          // `parked` held exclusively: the claimer below reads its slot ranges, then waits at its
          // window (the first of its statements to read `parked`), before its key lock
          const release = yield* Deferred.make<void>()
          const blocker = yield* holdOpenUntil(url, "LOCK TABLE awa.parked IN ACCESS EXCLUSIVE MODE", release)
          const claimer = yield* grants
            .claim(claimOf(q1, p, 1))
            .pipe(
              Effect.provide(pgGrants().pipe(Layer.provideMerge(eagerStorage(url, 1))), { local: true }),
              Effect.forkChild({ startImmediately: true })
            )
          let waiting = 0
          while (waiting === 0) {
            const [row] = yield* sql<{ n: number }>`
              SELECT count(*)::int AS n FROM pg_locks WHERE NOT granted AND relation = 'awa.parked'::regclass`
            waiting = row!.n
          }
          // meanwhile: the ring rotates, a job of the key is enqueued into the new slot, and an
          // earlier holder of the key's lock claims it and commits (written as claim_keyed writes
          // its claims row: claims are not taken while `parked` is held)
          assert.strictEqual(yield* storage.rotateWhenDue({ minRows: 1, maxAgeMs: 0 }), "Rotated")
          yield* storage.enqueueMany([{ kind: "k", queue: q2, args: {}, concurrencyKey: "t" }])
          yield* sql.withTransaction(
            Effect.gen(function* () {
              yield* sql.unsafe(`SELECT pg_advisory_xact_lock(l.ns, l.id) FROM ${keyLockOf("t")} l`)
              yield* sql.unsafe(`
                INSERT INTO awa.claims (slot, generation, job_id, run_lease, attempt, queue, priority, shard, lane_seq,
                                        claimed_at, key_policy, key_digest, key_seq, key_horizon, without_unique_key)
                SELECT r.slot, r.generation, r.job_id, r.run_lease + 1, r.attempt + 1, r.queue, r.priority, r.shard,
                       r.lane_seq, now(), '${p}', awa.key_digest('t'), s.v, s.v, true
                FROM awa.ready r, (SELECT nextval('awa.key_grant_seq') AS v) s
                WHERE r.queue = '${q2}'`)
            })
          )
          const [slots] = yield* sql<{ grant: number; pick: number }>`
            SELECT (SELECT c.slot FROM awa.claims c WHERE c.key_policy = ${p}) AS grant,
                   (SELECT r.slot FROM awa.ready r WHERE r.queue = ${q1}) AS pick`
          assert.notStrictEqual(slots!.grant, slots!.pick, "the earlier holder's grant lies in the new slot")
          yield* Deferred.succeed(release, undefined)
          yield* Fiber.join(blocker)
          // the count saw the new slot: the key is at its limit
          assert.strictEqual((yield* Fiber.join(claimer))._tag, "KeyGated")
          assert.strictEqual(yield* grants.openGrants(p, "t"), 1)
        })
      ),
    60_000
  )
})
