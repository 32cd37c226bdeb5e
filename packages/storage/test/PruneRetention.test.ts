/**
 * A queue's own retention (queue_meta.completed_retention) overrides the prune's argument when
 * the queue ring's slot is judged (0039 joins queue_meta once instead of calling retention() per
 * row): a queue that keeps nothing loses its completed jobs at prune, its neighbour keeps them.
 * A slot of at least 1,000 terminal rows is judged and copied in one statement (0048), the
 * others through an array: both branches are run here.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { SqlClient } from "effect/sql"
import { QueueStorage } from "../src/QueueStorage.ts"
import { claimOf, completeAll, fresh, keepAll, withEagerDatabase } from "./pgFixtures.ts"

describe("prune: per-queue retention", () => {
  it.live(
    "a queue whose completed retention is 0 keeps no history; the argument's day holds for the other",
    () =>
      withEagerDatabase({}, () =>
        Effect.gen(function* () {
          const storage = yield* QueueStorage
          const sql = yield* SqlClient.SqlClient
          const [keeps, drops] = [fresh("ret-keep"), fresh("ret-drop")]
          yield* sql`INSERT INTO awa.queue_meta (queue, completed_retention) VALUES (${drops}, interval '0')`
          const ids: Array<bigint> = []
          for (const q of [keeps, drops]) {
            yield* storage.enqueueMany([0, 1, 2].map((n) => ({ kind: "k", queue: q, args: { n } })))
            const claimed = yield* storage.claim(claimOf(q, 3))
            ids.push(...claimed.map((c) => c.jobId))
            yield* completeAll(claimed)
          }
          yield* storage.rotateWhenDue({ minRows: 1, maxAgeMs: 0 })
          // the first call may copy the slot's kept rows ahead ('Copied'); prune until the slot is gone
          for (let i = 0; i < 5; i++) {
            const outcome = yield* storage.prune({ ...keepAll, carryAfterMs: 0 })
            if (outcome._tag === "Pruned") break
          }
          const rows = yield* sql<{ queue: string; n: number }>`
          SELECT queue, count(*)::int AS n FROM awa.history WHERE job_id = ANY (${ids}) GROUP BY queue`
          assert.deepStrictEqual(
            rows.map((r) => [r.queue, r.n]),
            [[keeps, 3]]
          )
        })
      )
  )

  it.live(
    "a large slot, judged and copied in one statement, keeps per-queue retention, copies once and releases the keys it drops",
    () =>
      withEagerDatabase({}, () =>
        Effect.gen(function* () {
          const storage = yield* QueueStorage
          const sql = yield* SqlClient.SqlClient
          const [keeps, drops] = [fresh("big-keep"), fresh("big-drop")]
          yield* sql`INSERT INTO awa.queue_meta (queue, completed_retention) VALUES (${drops}, interval '0')`
          // 600 + 600 terminal rows in one slot: past 0048's 1,000, with fewer than 1,000 kept
          const per = 600
          const job = (queue: string, n: number) => ({
            kind: queue,
            queue,
            args: { n },
            unique: { byArgs: true }
          })
          for (const q of [keeps, drops]) {
            yield* storage.enqueueMany(Array.from({ length: per }, (_, n) => job(q, n)))
            yield* completeAll(yield* storage.claim(claimOf(q, per)))
          }
          // a completed job still holds its unique key until prune drops it
          const again = storage.enqueueMany([job(drops, 0)])
          assert.strictEqual((yield* Effect.flip(again))._tag, "UniqueConflict")
          const [sealed] = yield* sql<{ generation: string }>`
            SELECT generation::text AS generation FROM awa.ring_current('queue')`
          yield* storage.rotateWhenDue({ minRows: 1, maxAgeMs: 0 })
          const outcomes: Array<string> = []
          for (let i = 0; i < 5 && outcomes.at(-1) !== "Pruned"; i++)
            outcomes.push((yield* storage.prune({ ...keepAll, carryAfterMs: 0 }))._tag)
          assert.strictEqual(outcomes.at(-1), "Pruned")
          const rows = yield* sql<{ queue: string; n: number; distinct: number }>`
            SELECT queue, count(*)::int AS n, count(DISTINCT job_id)::int AS distinct
            FROM awa.history WHERE queue IN (${keeps}, ${drops}) GROUP BY queue`
          assert.deepStrictEqual(
            rows.map((r) => [r.queue, r.n, r.distinct]),
            [[keeps, per, per]],
            "the kept queue's rows once each, none of the other's"
          )
          // the copy kept the payload of the narrow terminal rows (from their ready rows)
          const [payload] = yield* sql<{ n: number }>`
            SELECT count(*)::int AS n FROM awa.history WHERE queue = ${keeps} AND kind = ${keeps} AND (args->>'n') IS NOT NULL`
          assert.strictEqual(payload!.n, per)
          const [rollup] = yield* sql<{ rollup: Record<string, number> }>`
            SELECT rollup FROM awa.ring_prunes WHERE ring = 'queue' AND generation = ${sealed!.generation}::bigint`
          assert.deepStrictEqual(rollup!.rollup, { [`${keeps}:completed`]: per, [`${drops}:completed`]: per })
          // the dropped jobs' keys were released: the same job can be enqueued again
          const [enqueued] = yield* again
          assert.strictEqual(enqueued!.queue, drops)
        })
      )
  )
})
