/**
 * The keyed claim's count of a key's open grants from the key's horizon (migration 0036,
 * docs/adr/0029-key-execution-grants.md, "Costs and limits"): every grant records key_seq (taken
 * after the key locks) and key_horizon (below it, every grant of the key was closed when it was
 * taken); the count reads the key's grants from the horizon of its newest grant, plus those
 * without a key_seq. These tests pin what the horizon must not forget (a long-open grant, grants
 * of an earlier lane of the same call, grants taken while the policy was disabled) and that the
 * count does not read the key's history.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { SqlClient } from "effect/sql"
import { type KeyedClaim, KeyGrants } from "../src/KeyGrants.ts"
import { type ClaimedJob, QueueStorage } from "../src/QueueStorage.ts"
import { fresh, withGrantsDatabase } from "./pgFixtures.ts"

const claimOf = (queue: string, policy: string, max = 10) => ({
  queue,
  policy,
  max,
  deadlineMs: 0,
  agingIntervalMs: 0
})
const jobsOf = (c: KeyedClaim): ReadonlyArray<ClaimedJob> => (c._tag === "Claimed" ? c.jobs : [])

const complete = (jobs: ReadonlyArray<ClaimedJob>) =>
  Effect.flatMap(QueueStorage, (s) =>
    s.finalizeMany(
      jobs.map((c) => ({ jobId: c.jobId, runLease: c.runLease, outcome: { _tag: "Complete" as const } }))
    )
  )

const enqueueKeyed = (queue: string, key: string, n: number, priority?: number) =>
  Effect.flatMap(QueueStorage, (s) =>
    s.enqueueMany(
      Array.from({ length: n }, (_, i) => ({
        kind: "k",
        queue,
        args: { i },
        concurrencyKey: key,
        ...(priority === undefined ? {} : { priority })
      }))
    )
  )

/** Entries the claims children's indexes returned to this backend's current transaction so far. */
const claimsIndexReads = Effect.flatMap(SqlClient.SqlClient, (sql) =>
  Effect.map(
    sql<{ n: number }>`
      SELECT coalesce(sum(pg_stat_get_xact_tuples_returned(x.indexrelid)), 0)::int AS n
      FROM pg_inherits i JOIN pg_index x ON x.indrelid = i.inhrelid
      WHERE i.inhparent = 'awa.claims'::regclass`,
    (rows) => rows[0]!.n
  )
)

describe("key grants counted from the key's horizon (0036)", () => {
  it.live("a long-open grant stays counted past many later grants of its key", () =>
    withGrantsDatabase(
      Effect.gen(function* () {
        const grants = yield* KeyGrants
        const q = fresh("horizon-long")
        const p = fresh("policy")
        yield* grants.create({ id: p, maxInFlight: 2 })
        yield* enqueueKeyed(q, "k", 44)
        // the long one: claimed first and never finished here
        const long = jobsOf(yield* grants.claim(claimOf(q, p, 1)))
        assert.strictEqual(long.length, 1)
        // forty short ones, one at a time, each completed before the next: each later grant's
        // horizon must stay at the long grant, not move past it
        for (let i = 0; i < 40; i++) {
          const short = jobsOf(yield* grants.claim(claimOf(q, p, 1)))
          assert.strictEqual(short.length, 1, `short grant ${i}`)
          yield* complete(short)
        }
        // the long grant and one more: at the limit
        const last = jobsOf(yield* grants.claim(claimOf(q, p, 3)))
        assert.strictEqual(last.length, 1)
        assert.strictEqual((yield* grants.claim(claimOf(q, p, 3)))._tag, "KeyGated")
        assert.strictEqual(yield* grants.openGrants(p, "k"), 2)
        // the long one finishes: one more may start
        yield* complete(long)
        assert.strictEqual(jobsOf(yield* grants.claim(claimOf(q, p, 3))).length, 1)
      })
    )
  )

  it.live("grants of the same key from an earlier lane of the same call are counted by later calls", () =>
    withGrantsDatabase(
      Effect.gen(function* () {
        const grants = yield* KeyGrants
        const q = fresh("horizon-lanes")
        const p = fresh("policy")
        yield* grants.create({ id: p, maxInFlight: 3 })
        // two lanes (two and three jobs of the key): one call admits 2 from lane 1, 1 from lane 2
        yield* enqueueKeyed(q, "k", 2, 1)
        yield* enqueueKeyed(q, "k", 3, 2)
        const first = jobsOf(yield* grants.claim(claimOf(q, p, 10)))
        assert.strictEqual(first.length, 3)
        assert.deepStrictEqual(
          first.map((j) => j.priority),
          [1, 1, 2]
        )
        // all three open: the next call must see them all (the lane-2 grant's horizon is not
        // above the lane-1 grants)
        assert.strictEqual((yield* grants.claim(claimOf(q, p, 10)))._tag, "KeyGated")
        yield* complete(first.slice(0, 1))
        assert.strictEqual(jobsOf(yield* grants.claim(claimOf(q, p, 10))).length, 1)
        assert.strictEqual((yield* grants.claim(claimOf(q, p, 10)))._tag, "KeyGated")
      })
    )
  )

  it.live("grants taken while the policy was disabled are counted once it is active again", () =>
    withGrantsDatabase(
      Effect.gen(function* () {
        const grants = yield* KeyGrants
        const sql = yield* SqlClient.SqlClient
        const q = fresh("horizon-disabled")
        const p = fresh("policy")
        yield* grants.create({ id: p, maxInFlight: 1 })
        yield* enqueueKeyed(q, "k", 6)
        // one counted grant, completed: the key has a horizon
        yield* complete(jobsOf(yield* grants.claim(claimOf(q, p, 1))))
        // disabled: no limit, grants recorded without key_seq
        yield* grants.forceDisable(p)
        const free = jobsOf(yield* grants.claim(claimOf(q, p, 3)))
        assert.strictEqual(free.length, 3)
        const [unordered] = yield* sql<{ n: number }>`
          SELECT count(*)::int AS n FROM awa.claims WHERE key_policy = ${p} AND key_seq IS NULL`
        assert.strictEqual(unordered!.n, 3)
        // a limit again (3 open, target 3: activates at once); the three are counted
        const change = yield* grants.lower(p, 3)
        assert.strictEqual(change.state, "active")
        assert.strictEqual((yield* grants.claim(claimOf(q, p, 3)))._tag, "KeyGated")
        yield* complete(free.slice(0, 1))
        assert.strictEqual(jobsOf(yield* grants.claim(claimOf(q, p, 3))).length, 1)
      })
    )
  )

  it.live("the count reads the grants since the key's horizon, not the key's history", () =>
    withGrantsDatabase(
      Effect.gen(function* () {
        const grants = yield* KeyGrants
        const sql = yield* SqlClient.SqlClient
        const q = fresh("horizon-history")
        const p = fresh("policy")
        yield* grants.create({ id: p, maxInFlight: 2 })
        yield* enqueueKeyed(q, "k", 202)
        // 200 grants of the key, each completed: all retained in the ring (no rotation here)
        for (let i = 0; i < 100; i++) yield* complete(jobsOf(yield* grants.claim(claimOf(q, p, 2))))
        const reads = yield* sql.withTransaction(
          Effect.gen(function* () {
            const before = yield* claimsIndexReads
            const claimed = jobsOf(yield* grants.claim(claimOf(q, p, 2)))
            assert.strictEqual(claimed.length, 2)
            return (yield* claimsIndexReads) - before
          })
        )
        // 0033 read all 200 of the key's grants; from the horizon: the newest grant (its horizon)
        // and the two grants from there
        assert.isBelow(reads, 10, `the keyed claim read ${reads} claims index entries`)
      })
    )
  )
})
