/**
 * Migration 0057 on an install with completed and open attempts: completions made before it wrote
 * a closure and a terminal row, those after it write the closure only (terminal_records derives
 * the row). Every reader must see each completed attempt once, whichever way it was written: the
 * jobs view, queue_stats' totals, and prune's judging and history copy.
 *
 * What would break: without the view's second branch a completion after the upgrade has no
 * representation in the jobs view at all (its claims row has a closure, its ready row a claim) and
 * is never copied into history; a second branch that read every 'completed' closure (not only those
 * carrying a lane_seq) counts the completions before it twice in queue_stats and copies them twice
 * into history. Seen to fail with each, and with each reader left on the terminal table.
 */
import { TestDatabase } from "@awa/testing"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { SqlClient } from "effect/sql"
import { apply, emptySchema } from "./upgradeFixtures.ts"

const day = 86_400_000

describe("migration 0057 on an install with completed and open attempts", () => {
  it.live("reads each completed attempt once, written before or after it, until and after prune", () =>
    Effect.gen(function* () {
      const sql = yield* SqlClient.SqlClient
      yield* emptySchema
      yield* apply((v) => v < 57)
      for (const n of [1, 2, 3, 4])
        yield* sql`SELECT awa.enqueue_one('k', 'q', 2, ${JSON.stringify({ n })}::jsonb, '{}'::jsonb, '[]'::jsonb,
                                          25, now(), NULL::bytea, 0)`
      const claimed = yield* sql<{ job_id: string; run_lease: string }>`
        SELECT c.job_id::text, c.run_lease::text FROM awa.claim('q', 4, 60000, 0) c ORDER BY c.job_id`
      assert.strictEqual(claimed.length, 4)
      const complete = (rows: ReadonlyArray<{ job_id: string; run_lease: string }>) =>
        sql<{ applied: boolean }>`
          SELECT applied FROM awa.finalize_completions(${rows.map((c) => c.job_id)}::bigint[],
                                                        ${rows.map((c) => c.run_lease)}::bigint[])`
      // two completed by 0055's function: a closure and a terminal row each
      assert.deepStrictEqual(
        (yield* complete(claimed.slice(0, 2))).map((r) => r.applied),
        [true, true]
      )
      yield* apply((v) => v === 57)
      // two completed by 0057's: a closure each, no terminal row
      assert.deepStrictEqual(
        (yield* complete(claimed.slice(2))).map((r) => r.applied),
        [true, true]
      )
      const [rows] = yield* sql<{ closures: number; terminal: number; records: number }>`
        SELECT (SELECT count(*)::int FROM awa.closures) AS closures, (SELECT count(*)::int FROM awa.terminal) AS terminal,
               (SELECT count(*)::int FROM awa.terminal_records) AS records`
      assert.deepStrictEqual(rows, { closures: 4, terminal: 2, records: 4 })

      // the jobs view: each completed, its attempt and finalization time from the closure
      const jobs = yield* sql<{ state: string; attempt: number; finalized: boolean; args: { n: number } }>`
        SELECT j.state, j.attempt, j.finalized_at IS NOT NULL AS finalized, j.args FROM awa.jobs j ORDER BY j.job_id`
      assert.deepStrictEqual(
        jobs.map((j) => [j.state, j.attempt, j.finalized, j.args.n]),
        [1, 2, 3, 4].map((n) => ["completed", 1, true, n])
      )
      const totals = () =>
        sql<{
          completed_total: string
        }>`SELECT completed_total::text FROM awa.queue_stats(3600000) WHERE queue = 'q'`
      assert.strictEqual((yield* totals())[0]!.completed_total, "4")

      // prune: judged once each, copied into history once each, counted once in the ledger
      assert.strictEqual((yield* sql<{ r: string }>`SELECT awa.rotate('queue', 0) AS r`)[0]!.r, "Rotated")
      let outcome = ""
      for (let i = 0; i < 5 && outcome !== "Pruned"; i++)
        outcome = (yield* sql<{ outcome: string }>`
          SELECT outcome FROM awa.prune_queue(5000, ${day}::bigint, ${day}::bigint, ${day}::bigint, 0::bigint, 0, 1000, 0::bigint)`)[0]!
          .outcome
      assert.strictEqual(outcome, "Pruned")
      const history = yield* sql<{ job_id: string; state: string; attempt: number; args: { n: number } }>`
        SELECT h.job_id::text, h.state, h.attempt, h.args FROM awa.history h ORDER BY h.job_id`
      assert.deepStrictEqual(
        history.map((h) => [h.job_id, h.state, h.attempt, h.args.n]),
        claimed.map((c, i) => [c.job_id, "completed", 1, i + 1])
      )
      assert.strictEqual((yield* totals())[0]!.completed_total, "4")
      assert.deepStrictEqual(
        (yield* sql<{ state: string }>`SELECT state FROM awa.jobs`).map((j) => j.state),
        ["completed", "completed", "completed", "completed"]
      )
    }).pipe(Effect.provide(TestDatabase.layer({ migrated: false })))
  )
})
