/**
 * queue_stats costs its backlog, also when its plan is made before the ring children have
 * statistics (a fresh install, a first backlog: the leader's stats sample calls it then). Its
 * available count once probed the tombstones of all 16 children per backlog row (0037). Index scans Postgres counts for the
 * current transaction tell the plans apart without timing anything.
 */

import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { SqlClient } from "effect/sql"
import { QueueStorage } from "../src/QueueStorage.ts"
import { claimOf, fresh, withEagerDatabase } from "./pgFixtures.ts"

/** Index scans of a ring table's children so far in this transaction. */
const indexScansSql = (table: string) => `
  SELECT coalesce(sum(pg_stat_get_xact_numscans(x.indexrelid)), 0)::int AS n
  FROM pg_inherits i JOIN pg_index x ON x.indrelid = i.inhrelid
  WHERE i.inhparent = 'awa.${table}'::regclass`

describe("queue_stats on children without statistics", () => {
  it.live(
    "counts 2,000 available jobs (and 300 running) with a bounded number of tombstone probes",
    () =>
      withEagerDatabase({}, () =>
        Effect.gen(function* () {
          const storage = yield* QueueStorage
          const sql = yield* SqlClient.SqlClient
          const q = fresh("stats-fresh")
          yield* storage.enqueueMany(
            Array.from({ length: 2300 }, (_, n) => ({ kind: "k", queue: q, args: { n } }))
          )
          const claimed = yield* storage.claim(claimOf(q, 300))
          assert.strictEqual(claimed.length, 300)
          const { stats, tombstoneScans } = yield* sql.withTransaction(
            Effect.gen(function* () {
              const scans = Effect.map(
                sql.unsafe<{ n: number }>(indexScansSql("ready_tombstones")),
                (r) => r[0]!.n
              )
              const before = yield* scans
              const stats = (yield* storage.queueStats()).queues.find((x) => x.queue === q)!
              return { stats, tombstoneScans: (yield* scans) - before }
            })
          )
          assert.deepStrictEqual([stats.available, stats.running], [2000, 300])
          // per lane a range count and a head probe (was 16 per backlog row: 32,000)
          assert.isBelow(tombstoneScans, 100, `tombstone index scans: ${tombstoneScans}`)
        })
      ),
    120_000
  )
})
