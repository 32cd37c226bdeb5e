/**
 * Migration 0053 on an install with attempts in flight: the claims written before it have no
 * spans of their own, and rescue finds attempts only through spans (or, past 1,000 claims, by a
 * scan). The migration writes spans for every existing claim under its lock on `claims`.
 *
 * What would break: without that backfill, every attempt open at the upgrade would be invisible to
 * both sweeps: a worker that died holding one would leave its job running forever. Seen to fail
 * with the backfill statement removed (the sweep found none of the ten).
 */
import { TestDatabase } from "@awa/testing"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { SqlClient } from "effect/sql"
import { apply, emptySchema } from "./upgradeFixtures.ts"

describe("migration 0053 on an install with open attempts", () => {
  it.live("writes spans for the claims before it: rescue finds every attempt open at the upgrade", () =>
    Effect.gen(function* () {
      const sql = yield* SqlClient.SqlClient
      yield* emptySchema
      yield* apply((v) => v < 53)
      for (let n = 0; n < 12; n++)
        yield* sql`SELECT awa.enqueue_one('k', 'q', 2, ${JSON.stringify({ n })}::jsonb, '{}'::jsonb, '[]'::jsonb,
                                          25, now(), NULL, 0)`
      // ten open attempts, claimed by 0052's claim (no span)
      const claimed = yield* sql<{ a: string }>`
        SELECT c.job_id || ':' || c.run_lease AS a FROM awa.claim('q', 10, 60000, 0) c`
      assert.strictEqual(claimed.length, 10)
      yield* apply((v) => v === 53)
      const rescued = yield* sql<{ a: string }>`
        SELECT r.job_id || ':' || r.run_lease AS a FROM awa.rescue('stale', 0, 1000) r`
      assert.deepStrictEqual(rescued.map((r) => r.a).sort(), claimed.map((r) => r.a).sort())
      const spans = yield* sql<{ n: number }>`SELECT count(*)::int AS n FROM awa.claim_spans`
      assert.strictEqual(spans[0]!.n, 1) // one call, one slot
    }).pipe(Effect.provide(TestDatabase.layer({ migrated: false })))
  )
})
