/**
 * Migration 0053: a claim call records its claims' times once per slot in `claim_spans`, and the
 * claims rows lose their two timestamp indexes. Rescue's stale and deadline sweeps find open
 * attempts through the spans (span → the lane's ready rows of its slot → their claims).
 *
 * What would break: a writer of claims rows that writes no span (or one that does not cover its
 * claims) leaves its open attempts out of every sweep: a crashed worker's jobs would never run
 * again. Each writer is exercised here: claim's pick, claim's keys-at-claim statement (its span lies
 * inside the pick's, so a sweep that does not collapse overlapping spans spends two places of its
 * limit on one attempt),
 * claim_keyed, and prune's carry of open claims into the current slot. Seen to fail with the span
 * insert removed from each writer in turn (the sweeps missed those attempts), and with the stale
 * sweep's DISTINCT ON removed (with a limit of exactly the open attempts, three were left out).
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { SqlClient } from "effect/sql"
import { KeyGrants } from "../src/KeyGrants.ts"
import type { ClaimedJob, RescuedAttempt } from "../src/QueueStorage.ts"
import { QueueStorage } from "../src/QueueStorage.ts"
import { completeAll, fresh, withGrantsDatabase } from "./pgFixtures.ts"

type Attempt = `${string}:${string}`
const attemptOf = (a: { readonly jobId: bigint; readonly runLease: bigint }): Attempt =>
  `${a.jobId}:${a.runLease}`

/** Every attempt with a claims row and no closure, from the tables themselves. */
const openAttempts = Effect.flatMap(SqlClient.SqlClient, (sql) =>
  Effect.map(
    sql<{ a: Attempt }>`
      SELECT c.job_id || ':' || c.run_lease AS a FROM awa.claims c
      WHERE NOT EXISTS (SELECT 1 FROM awa.closures z WHERE z.job_id = c.job_id AND z.run_lease = c.run_lease)`,
    (rows) => rows.map((r) => r.a).sort()
  )
)

const sorted = (rescued: ReadonlyArray<RescuedAttempt>) => rescued.map(attemptOf).sort()

/** Until every claim's deadline has passed, as the server's clock says. */
const untilDeadlinesPassed = Effect.gen(function* () {
  const sql = yield* SqlClient.SqlClient
  for (;;) {
    const [row] = yield* sql<{ passed: boolean }>`SELECT now() > max(deadline_at) AS passed FROM awa.claims`
    if (row!.passed) return
    yield* Effect.sleep("5 millis")
  }
})

/**
 * Claims through every writer of claims rows, with a deadline of `deadlineMs` (0: none), and closes
 * some of each, in two slots: the first slot's open attempts are carried by prune into the second.
 * Returns each round's claimed attempts, the plain queue's then the keyed one's.
 */
const claimThroughEveryWriter = (deadlineMs: number) =>
  Effect.gen(function* () {
    const storage = yield* QueueStorage
    const grants = yield* KeyGrants
    const plain = fresh("spans")
    const keyed = fresh("spans-keyed")
    const policy = `${keyed}-policy`
    yield* grants.create({ id: policy, maxInFlight: 100 })
    const claimPlain = (max: number) => storage.claim({ queue: plain, max, deadlineMs, agingIntervalMs: 0 })
    const claimKeyed = (max: number) =>
      Effect.map(grants.claim({ queue: keyed, policy, max, deadlineMs, agingIntervalMs: 0 }), (out) =>
        out._tag === "Claimed" ? out.jobs : []
      )
    const enqueue = (round: number) =>
      Effect.all([
        // plain jobs with jobs whose unique key is taken at claim among them: claim's pick takes
        // the first kind, its keys-at-claim statement the second, in one call. The first position
        // is of the second kind: its span is the only one that covers it (the others lie inside
        // the pick's span: overlapping spans)
        storage.enqueueMany(
          Array.from({ length: 12 }, (_, n) =>
            n % 3 === 0
              ? {
                  kind: "k",
                  queue: plain,
                  args: { round, n },
                  unique: { byArgs: true, states: ["running"] as const }
                }
              : { kind: "k", queue: plain, args: { round, n } }
          )
        ),
        storage.enqueueMany(
          Array.from({ length: 8 }, (_, n) => ({
            kind: "k",
            queue: keyed,
            args: { round, n },
            concurrencyKey: `key-${n % 4}`
          }))
        )
      ])
    const claimRound = (round: number) =>
      Effect.gen(function* () {
        yield* enqueue(round)
        const fromPlain = yield* claimPlain(100)
        const fromKeyed = yield* claimKeyed(100)
        assert.strictEqual(fromPlain.length, 12)
        assert.strictEqual(fromKeyed.length, 8)
        // about a third of each closes; the rest stays open
        yield* completeAll([...fromPlain.slice(0, 4), ...fromKeyed.slice(0, 3)])
        return [...fromPlain, ...fromKeyed] as ReadonlyArray<ClaimedJob>
      })
    const first = yield* claimRound(0)
    assert.strictEqual(yield* storage.rotate, "Rotated")
    const pruned = yield* storage.prune({ completedMs: 0, failedMs: 0, cancelledMs: 0, carryAfterMs: 0 })
    assert.strictEqual(pruned._tag === "Pruned" ? pruned.carried : pruned._tag, 13)
    const second = yield* claimRound(1)
    return { first, second }
  })

describe("claim spans (0053)", () => {
  it.live("the stale sweep finds every open attempt once, whichever statement wrote its claims row", () =>
    withGrantsDatabase(
      Effect.gen(function* () {
        const storage = yield* QueueStorage
        const { first, second } = yield* claimThroughEveryWriter(0)
        const open = yield* openAttempts
        assert.strictEqual(open.length, 26)
        // every open attempt, of the first slot (carried) and of the second
        for (const c of [
          ...first.slice(4, 12),
          ...first.slice(15),
          ...second.slice(4, 12),
          ...second.slice(15)
        ])
          assert.include(open, attemptOf(c))
        // a limit of exactly as many: an attempt that two spans cover must not take two places
        const rescued = yield* storage.rescueStale({ stalenessMs: 0, limit: open.length })
        assert.deepStrictEqual(sorted(rescued), open)
        assert.deepStrictEqual(yield* openAttempts, [])
      })
    )
  )

  it.live("the deadline sweep finds every open attempt past its deadline once, and none before it", () =>
    withGrantsDatabase(
      Effect.gen(function* () {
        const storage = yield* QueueStorage
        yield* claimThroughEveryWriter(1)
        const open = yield* openAttempts
        assert.strictEqual(open.length, 26)
        yield* untilDeadlinesPassed
        // and attempts claimed now with a day's deadline, which no sweep may take
        const q = fresh("spans-later")
        yield* storage.enqueueMany(
          Array.from({ length: 5 }, (_, n) => ({ kind: "k", queue: q, args: { n } }))
        )
        const later = yield* storage.claim({ queue: q, max: 5, deadlineMs: 86_400_000, agingIntervalMs: 0 })
        assert.strictEqual(later.length, 5)
        const rescued = yield* storage.rescueDeadlines(open.length)
        assert.deepStrictEqual(sorted(rescued), open)
        assert.deepStrictEqual(yield* openAttempts, later.map(attemptOf).sort())
      })
    )
  )

  it.live("past 1,000 claims the sweeps read claims themselves, and find the same open attempts", () =>
    withGrantsDatabase(
      Effect.gen(function* () {
        const storage = yield* QueueStorage
        const q = fresh("spans-many")
        yield* storage.enqueueMany(
          Array.from({ length: 1_100 }, (_, n) => ({ kind: "k", queue: q, args: { n } }))
        )
        // one call, one span of 1,100 positions: more than the spans' path takes
        const claimed = yield* storage.claim({ queue: q, max: 1_100, deadlineMs: 1, agingIntervalMs: 0 })
        assert.strictEqual(claimed.length, 1_100)
        yield* completeAll(claimed.slice(7))
        const open = yield* openAttempts
        assert.deepStrictEqual(open, claimed.slice(0, 7).map(attemptOf).sort())
        yield* untilDeadlinesPassed
        // the deadline sweep takes three of them (its limit), the stale sweep the other four
        const byDeadline = yield* storage.rescueDeadlines(3)
        assert.strictEqual(byDeadline.length, 3)
        const byStaleness = yield* storage.rescueStale({ stalenessMs: 0, limit: 1000 })
        assert.deepStrictEqual([...sorted(byDeadline), ...sorted(byStaleness)].sort(), open)
        assert.deepStrictEqual(yield* openAttempts, [])
      })
    )
  )

  it.live("a claim call writes one span per slot its rows lie in, and claims has no time index", () =>
    withGrantsDatabase(
      Effect.gen(function* () {
        const storage = yield* QueueStorage
        const sql = yield* SqlClient.SqlClient
        const q = fresh("spans-slots")
        const spans = Effect.map(
          sql<{ slot: number; first: string; last: string; n: number }>`
            SELECT s.slot, s.first_lane_seq::text AS first, s.last_lane_seq::text AS last,
                   (SELECT count(*)::int FROM awa.claims c WHERE c.slot = s.slot AND c.queue = s.queue
                      AND c.lane_seq BETWEEN s.first_lane_seq AND s.last_lane_seq) AS n
            FROM awa.claim_spans s WHERE s.queue = ${q} ORDER BY s.slot`,
          (rows) => rows.map((r) => [r.slot, Number(r.last) - Number(r.first) + 1, r.n])
        )
        yield* storage.enqueueMany(
          Array.from({ length: 150 }, (_, n) => ({ kind: "k", queue: q, args: { n } }))
        )
        const slotOfFirst = (yield* sql<{
          slot: number
        }>`SELECT slot FROM awa.ready WHERE queue = ${q} LIMIT 1`)[0]!.slot
        assert.strictEqual(yield* storage.rotate, "Rotated")
        yield* storage.enqueueMany(
          Array.from({ length: 50 }, (_, n) => ({ kind: "k", queue: q, args: { n } }))
        )
        const claimed = yield* storage.claim({ queue: q, max: 200, deadlineMs: 0, agingIntervalMs: 0 })
        assert.strictEqual(claimed.length, 200)
        assert.deepStrictEqual(yield* spans, [
          [slotOfFirst, 150, 150],
          [(slotOfFirst + 1) % 16, 50, 50]
        ])
        const timeIndexes = yield* sql<{ n: number }>`
          SELECT count(*)::int AS n FROM pg_indexes
          WHERE schemaname = 'awa' AND tablename = 'claims' AND (indexdef LIKE '%claimed_at%' OR indexdef LIKE '%deadline_at%')`
        assert.strictEqual(timeIndexes[0]!.n, 0)
      })
    )
  )
})
