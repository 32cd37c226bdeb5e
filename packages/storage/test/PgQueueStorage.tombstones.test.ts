/**
 * Migration 0052: claim's pick and claim_keyed's window probe the tombstones per row only when
 * their lane has one at or past the cursor in the live slots, which one uncorrelated probe in the
 * same statement (and snapshot) asks first.
 *
 * What would break: a first probe that misses a tombstone it should see (the cursor's own
 * position, another slot than the head's, the batch's last row) claims a cancelled job; a first
 * probe that never finds one leaves the per-row probe running on every claim (the cost 0052
 * removes), which the index-scan counts below tell apart. Seen to fail on 0047's functions (the
 * claim without a tombstone ahead started 192 tombstone index scans: 64 rows, three live slots),
 * and with the first probe asking `> cursor` instead of `>= cursor` (the second claim took the
 * cancelled job at the cursor).
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { SqlClient } from "effect/sql"
import { KeyGrants } from "../src/KeyGrants.ts"
import type { ClaimedJob } from "../src/QueueStorage.ts"
import { QueueStorage } from "../src/QueueStorage.ts"
import { claimers, fresh, withGrantsDatabase } from "./pgFixtures.ts"

const names = (rows: ReadonlyArray<ClaimedJob>) => rows.map((r) => (r.args as { n: number }).n)

const policyOf = (q: string) => `${q}-policy`

/** The claim under test, returning the jobs' `n`s (the keyed one under a policy no key reaches). */
const claimerOf = (claimer: keyof typeof claimers) => (q: string, max: number) =>
  Effect.map(claimers[claimer](q, policyOf(q), max), names)

/** Enqueues jobs n = from … to-1 on the queue (each with its own concurrency key). */
const enqueueRange = (q: string, from: number, to: number) =>
  Effect.flatMap(QueueStorage, (storage) =>
    storage.enqueueMany(
      Array.from({ length: to - from }, (_, i) => ({
        kind: "tomb",
        queue: q,
        args: { n: from + i },
        concurrencyKey: `k${from + i}`
      }))
    )
  )

/** Index scans the current transaction started on the tombstone children's indexes. */
const tombstoneIndexScans = `
  (SELECT coalesce(sum(pg_stat_get_xact_numscans(x.indexrelid)), 0)::int
     FROM pg_inherits i JOIN pg_index x ON x.indrelid = i.inhrelid
    WHERE i.inhparent = 'awa.ready_tombstones'::regclass)`

const range = (from: number, to: number) => Array.from({ length: to - from }, (_, i) => from + i)

describe("tombstone probes in the claim (0052)", () => {
  it.live.each(Object.keys(claimers) as Array<keyof typeof claimers>)(
    "%s skips exactly the cancelled rows: at the cursor, mid-batch, first and last of another slot",
    (claimer) =>
      withGrantsDatabase(
        Effect.gen(function* () {
          const storage = yield* QueueStorage
          const q = fresh("tomb")
          yield* (yield* KeyGrants).create({ id: policyOf(q), maxInFlight: 1_000 })
          // positions 0-9 in one slot, 10-19 in the next
          const first = yield* enqueueRange(q, 0, 10)
          assert.strictEqual(yield* storage.rotate, "Rotated")
          const second = yield* enqueueRange(q, 10, 20)
          const cancelled = [first[0]!, first[4]!, second[0]!, second[9]!]
          for (const job of cancelled) yield* storage.cancelJob(job.id, "test")
          const claim = claimerOf(claimer)
          assert.deepStrictEqual(
            yield* claim(q, 100),
            [1, 2, 3, 5, 6, 7, 8, 9, 11, 12, 13, 14, 15, 16, 17, 18]
          )
          assert.deepStrictEqual(yield* claim(q, 100), [])
          // more jobs behind the cursor, which still rests on the cancelled 19: it and the rows
          // cancelled since are skipped
          const third = yield* enqueueRange(q, 20, 25)
          yield* storage.cancelJob(third[0]!.id, "test")
          yield* storage.cancelJob(third[3]!.id, "test")
          assert.deepStrictEqual(yield* claim(q, 100), [21, 22, 24])
        })
      )
  )

  it.live.each(Object.keys(claimers) as Array<keyof typeof claimers>)(
    "%s probes per row only while its lane has a tombstone at or past the cursor",
    (claimer) =>
      withGrantsDatabase(
        Effect.gen(function* () {
          const storage = yield* QueueStorage
          const sql = yield* SqlClient.SqlClient
          const q = fresh("tomb")
          yield* (yield* KeyGrants).create({ id: policyOf(q), maxInFlight: 1_000 })
          const claim = claimerOf(claimer)
          // a tombstone behind the cursor (its row was skipped by a claim), and three live slots
          const head = yield* enqueueRange(q, 0, 2)
          yield* storage.cancelJob(head[0]!.id, "test")
          assert.deepStrictEqual(yield* claim(q, 10), [1])
          yield* enqueueRange(q, 2, 70)
          assert.strictEqual(yield* storage.rotate, "Rotated")
          yield* enqueueRange(q, 70, 140)
          assert.strictEqual(yield* storage.rotate, "Rotated")
          const rest = yield* enqueueRange(q, 140, 210)
          /** Claims `max` in one transaction: the jobs, and the tombstone index scans it started. */
          const counted = (max: number) =>
            sql.withTransaction(
              Effect.gen(function* () {
                const [before] = yield* sql.unsafe<{ n: number }>(`SELECT ${tombstoneIndexScans} AS n`)
                const jobs = yield* claim(q, max)
                const [after] = yield* sql.unsafe<{ n: number }>(`SELECT ${tombstoneIndexScans} AS n`)
                return { jobs, scans: after!.n - before!.n }
              })
            )
          // no tombstone at or past the cursor: the first probe only, one scan per live slot
          const clean = yield* counted(64)
          assert.deepStrictEqual(clean.jobs, range(2, 66))
          assert.isAtMost(clean.scans, 8, `tombstone index scans without a tombstone ahead: ${clean.scans}`)
          // one far ahead (the last job): every picked row is probed again
          yield* storage.cancelJob(rest[69]!.id, "test")
          const probed = yield* counted(64)
          assert.deepStrictEqual(probed.jobs, range(66, 130))
          assert.isAtLeast(probed.scans, 64, `tombstone index scans with a tombstone ahead: ${probed.scans}`)
        })
      )
  )
})
