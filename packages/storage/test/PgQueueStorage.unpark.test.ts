/**
 * `unpark` brings a lane's parked rows back at a cost linear in the rows it moves (migration 0026).
 * Its move statement was `DELETE … WHERE lane_seq IN (SELECT … ORDER BY lane_seq LIMIT n)`; on a
 * `parked` table without statistics (a fresh or fast-growing table before autovacuum's analyze)
 * the planner made that a nested loop running the subquery once per parked row of the lane: a
 * queue resumed with 45,000 parked jobs brought 4,096 of them back in seconds per call (the
 * liveness benchmark's drain ran at ~300 jobs/s). Block reads, counted by Postgres for the
 * current transaction, tell the two plans apart without timing anything.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { SqlClient } from "effect/sql"
import { QueueStorage } from "../src/QueueStorage.ts"
import { fresh, keepNothing, withEagerDatabase } from "./pgFixtures.ts"

describe("unpark", () => {
  it.live("moves a batch of a large parked lane reading blocks in proportion to the batch", () =>
    withEagerDatabase({}, () =>
      Effect.gen(function* () {
        const storage = yield* QueueStorage
        const sql = yield* SqlClient.SqlClient
        const q = fresh("unpark")
        // no statistics on parked, as before autovacuum's first analyze of it
        yield* sql`ALTER TABLE awa.parked SET (autovacuum_enabled = false)`
        yield* storage.pauseQueue(q)
        for (let i = 0; i < 3; i++)
          yield* storage.enqueueMany(
            Array.from({ length: 1000 }, (_, n) => ({ kind: "k", queue: q, args: { n } }))
          )
        assert.strictEqual(yield* storage.rotate, "Rotated")
        assert.strictEqual((yield* storage.prune(keepNothing))._tag, "Pruned")
        const parked = Effect.map(
          sql<{ n: number }>`SELECT count(*)::int AS n FROM awa.parked WHERE queue = ${q}`,
          (rows) => rows[0]!.n
        )
        assert.strictEqual(yield* parked, 3000, "a paused queue's residue is parked")
        yield* storage.resumeQueue(q)
        const [moved] = yield* sql.withTransaction(
          sql<{ moved: number; blocks: number }>`
            SELECT awa.unpark(1000) AS moved,
                   (pg_stat_get_xact_blocks_fetched('awa.parked'::regclass)
                    + pg_stat_get_xact_blocks_fetched('awa.parked_pkey'::regclass))::int AS blocks`
        )
        assert.strictEqual(moved!.moved, 1000)
        assert.strictEqual(yield* parked, 2000)
        // linear: a few thousand fetches (one per row moved, plus the index pages); the nested
        // loop fetched about 1,000 per parked row of the lane (millions)
        assert.isBelow(moved!.blocks, 20_000, `blocks fetched from parked: ${moved!.blocks}`)
      })
    )
  )
})
