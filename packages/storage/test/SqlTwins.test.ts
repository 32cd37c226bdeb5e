/** The SQL twins of pure TypeScript rules must agree with them (capabilities.md §3, §5). */
import { Backoff } from "@awa/core"
import { TestDatabase } from "@awa/testing"
import { describe, expect, layer } from "@effect/vitest"
import { Effect } from "effect"
import { SqlClient } from "effect/sql"
import fc from "fast-check"

describe("SQL twins", () => {
  layer(TestDatabase.layer(), { excludeTestServices: true })("on Postgres", (it) => {
    it.effect(
      "awa.backoff_ms gives exactly the TypeScript backoff for the same attempt and random draw",
      () =>
        Effect.gen(function* () {
          const sql = yield* SqlClient.SqlClient
          const samples = fc.sample(
            fc.tuple(
              fc.integer({ min: 0, max: 40 }),
              fc.double({ min: 0, max: 1, maxExcluded: true, noNaN: true })
            ),
            300
          )
          const rows = yield* sql<{ ms: string }>`
          SELECT awa.backoff_ms(a, r)::text AS ms
          FROM unnest(${samples.map(([a]) => a)}::int[], ${samples.map(([, r]) => String(r))}::text[]::float8[]) WITH ORDINALITY AS t(a, r, o)
          ORDER BY o`
          const sqlValues = rows.map((r) => Number(r.ms))
          const tsValues = samples.map(([a, r]) => Backoff.defaultBackoffMs(a, r))
          for (const [i, [a]] of samples.entries()) {
            const { min, max } = Backoff.backoffBounds(a)
            expect(sqlValues[i]).toBeGreaterThanOrEqual(min)
            expect(sqlValues[i]).toBeLessThanOrEqual(max)
            // numeric vs float64 rounding may differ by a millisecond at most
            expect(Math.abs(sqlValues[i]! - tsValues[i]!)).toBeLessThanOrEqual(1)
          }
        })
    )
  })
})
