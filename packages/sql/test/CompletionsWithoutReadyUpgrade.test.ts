/**
 * Migration 0055 on an install with attempts in flight: their claims rows, written by 0054's claim,
 * do not say whether their job has a unique key (without_unique_key is NULL), so
 * finalize_completions must read their ready rows as before.
 *
 * What would break: a claim without the flag read as "no unique key" would complete an attempt
 * open at the upgrade without its key's handling: a mask holding 'completed' but not 'running'
 * would not take the key back, and a duplicate would be accepted. Seen to fail with the read
 * limited to claims whose flag is false (no key taken back: 0 rows).
 */
import { TestDatabase } from "@awa/testing"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { SqlClient } from "effect/sql"
import { apply, emptySchema } from "./upgradeFixtures.ts"

/** The mask `available | completed` (capabilities.md §4): released at claim, taken back at completion. */
const availableOrCompleted = 2 | 32

describe("migration 0055 on an install with open attempts", () => {
  it.live("completes the attempts claimed before it with their unique keys' handling", () =>
    Effect.gen(function* () {
      const sql = yield* SqlClient.SqlClient
      yield* emptySchema
      yield* apply((v) => v < 55)
      for (const n of [1, 2, 3])
        yield* sql`SELECT awa.enqueue_one('k', 'q', 2, ${JSON.stringify({ n })}::jsonb, '{}'::jsonb, '[]'::jsonb,
                                          25, now(), ${Buffer.from(`key-${n}`)}, ${availableOrCompleted})`
      const claimed = yield* sql<{ job_id: string; run_lease: string }>`
        SELECT c.job_id::text, c.run_lease::text FROM awa.claim('q', 3, 60000, 0) c`
      assert.strictEqual(claimed.length, 3)
      const held = () => sql<{ n: number }>`SELECT count(*)::int AS n FROM awa.unique_claims`
      assert.strictEqual((yield* held())[0]!.n, 0, "released at claim ('running' is not in the mask)")
      yield* apply((v) => v === 55)
      const flags = yield* sql<{ flag: boolean | null }>`SELECT without_unique_key AS flag FROM awa.claims`
      assert.deepStrictEqual(flags, [{ flag: null }, { flag: null }, { flag: null }])
      const done = yield* sql<{ applied: boolean }>`
        SELECT applied FROM awa.finalize_completions(${claimed.map((c) => c.job_id)}::bigint[],
                                                      ${claimed.map((c) => c.run_lease)}::bigint[])`
      assert.deepStrictEqual(
        done.map((d) => d.applied),
        [true, true, true]
      )
      assert.strictEqual((yield* held())[0]!.n, 3, "each key taken back at completion")
    }).pipe(Effect.provide(TestDatabase.layer({ migrated: false })))
  )
})
