/**
 * The fleet-wide rate limit on Postgres (migration 0043, docs/adr/0036-fleet-rate-limit.md):
 * burst then throttle with the next token's time; a rolled-back claim gives its tokens back;
 * concurrent claimers on separate connections together never exceed `burst + rate × W` in any
 * window (measured on the claims' own `claimed_at`, the clock the limit uses); bad input.
 */
import { ValidationError } from "@awa/core"
import { TestDatabase } from "@awa/testing"
import { assert, describe, layer } from "@effect/vitest"
import { Effect, Exit, Layer } from "effect"
import { SqlClient } from "effect/sql"
import { FlowStorage, layerPg as flowLayer } from "../src/FlowStorage.ts"
import { layer as pgLayer } from "../src/PgQueueStorage.ts"
import { QueueStorage } from "../src/QueueStorage.ts"
import { claimOf, fresh } from "./pgFixtures.ts"

const backlog = (queue: string, n: number) =>
  Effect.flatMap(QueueStorage, (s) =>
    s.enqueueMany(Array.from({ length: n }, (_, i) => ({ kind: "rated", queue, args: { i } })))
  )

const rated = (queue: string, max: number, maxRate: number, burst: number) =>
  Effect.flatMap(FlowStorage, (f) => f.claimRated({ ...claimOf(queue, max), rate: { maxRate, burst } }))

/** Waits (real time) until `at`: the condition is the clock itself. */
const until = (at: Date) => Effect.sleep(Math.max(0, at.getTime() - Date.now() + 5))

describe("fleet-wide rate limit on Postgres", () => {
  layer(
    Layer.mergeAll(pgLayer(), flowLayer()).pipe(
      Layer.provideMerge(TestDatabase.layer({ maxConnections: 8 }))
    ),
    { excludeTestServices: true, timeout: "120 seconds" }
  )((it) => {
    it.effect(
      "burst, then nothing with the next token's time; a rolled-back claim gives its tokens back",
      () =>
        Effect.gen(function* () {
          const queue = fresh("rated")
          yield* backlog(queue, 50)
          const first = yield* rated(queue, 20, 1, 5)
          assert.strictEqual(first.jobs.length, 5, "the burst")
          assert.isDefined(first.nextTokenAt, "cut short by the rate: it says when to come back")
          const second = yield* rated(queue, 20, 1, 5)
          assert.strictEqual(second.jobs.length, 0)
          const next = second.nextTokenAt!
          assert.isDefined(next)
          // 5 tokens taken at t, the next one 1 s later (t is the claim's transaction start); 1/s so that
          // a slow machine cannot earn a token between the two claims
          assert.isAtMost(next.getTime() - Date.now(), 1010)
          yield* until(next)
          // a claim that takes the token, rolled back: the token is still there afterwards
          const sql = yield* SqlClient.SqlClient
          const rolledBack = yield* Effect.exit(
            sql.withTransaction(Effect.andThen(rated(queue, 1, 1, 5), Effect.fail("roll back" as const)))
          )
          assert.isTrue(Exit.isFailure(rolledBack))
          const third = yield* rated(queue, 20, 1, 5)
          assert.isAtLeast(third.jobs.length, 1, "the rolled-back claim's token came back")
        })
    )

    it.effect("concurrent claimers on separate connections never exceed burst + rate × W", () =>
      Effect.gen(function* () {
        const queue = fresh("rated")
        yield* backlog(queue, 2000)
        const maxRate = 40
        const burst = 4
        const endAt = Date.now() + 1500
        const claimer = Effect.gen(function* () {
          let taken = 0
          while (Date.now() < endAt) {
            const c = yield* rated(queue, 10, maxRate, burst)
            taken += c.jobs.length
            if (c.jobs.length === 0)
              yield* Effect.sleep(Math.max(1, (c.nextTokenAt?.getTime() ?? Date.now()) - Date.now()))
          }
          return taken
        })
        const taken = yield* Effect.all([claimer, claimer, claimer, claimer], { concurrency: "unbounded" })
        const sql = yield* SqlClient.SqlClient
        const rows = yield* sql<{ t: number }>`
          SELECT extract(epoch FROM c.claimed_at)::float8 AS t FROM awa.claims c WHERE c.queue = ${queue} ORDER BY 1`
        const at = rows.map((r) => r.t)
        assert.strictEqual(
          at.length,
          taken.reduce((a, b) => a + b, 0)
        )
        assert.isAtLeast(at.length, burst + 10, "the claimers got jobs")
        let worst = Number.NEGATIVE_INFINITY
        for (let i = 0; i < at.length; i++)
          for (let j = i; j < at.length; j++)
            worst = Math.max(worst, j - i + 1 - (burst + maxRate * (at[j]! - at[i]!)))
        assert.isAtMost(worst, 1e-6, `${at.length} claims: a window exceeded burst + rate × W by ${worst}`)
      })
    )

    it.effect("bad input is a ValidationError and claims nothing", () =>
      Effect.gen(function* () {
        const queue = fresh("rated")
        yield* backlog(queue, 5)
        for (const [maxRate, burst, field] of [
          [0, 1, "fleetRateLimit.maxRate"],
          [100_001, 1, "fleetRateLimit.maxRate"],
          [Number.NaN, 1, "fleetRateLimit.maxRate"],
          [5, -1, "fleetRateLimit.burst"],
          [5, 1.5, "fleetRateLimit.burst"]
        ] as const) {
          const exit = yield* Effect.exit(rated(queue, 5, maxRate, burst))
          const error =
            Exit.isFailure(exit) && exit.cause.reasons[0]?._tag === "Fail"
              ? exit.cause.reasons[0].error
              : undefined
          assert.instanceOf(error, ValidationError, `${maxRate} / ${burst}`)
          assert.strictEqual((error as ValidationError).field, field)
        }
        const sql = yield* SqlClient.SqlClient
        const claimed = yield* sql<{
          n: number
        }>`SELECT count(*)::int AS n FROM awa.claims c WHERE c.queue = ${queue}`
        assert.strictEqual(claimed[0]!.n, 0)
      })
    )

    // A SQL caller skips the runtime's checks: the functions check for themselves (rate_tokens,
    // migration 0046, does it for both and names the one called), and a claim of nothing takes
    // no rate lock (so a claimer asking for 0 never waits behind one that claims).
    it.effect("the SQL functions refuse a bad rate by name; a claim of 0 takes no rate lock", () =>
      Effect.gen(function* () {
        const sql = yield* SqlClient.SqlClient
        const queue = fresh("rated")
        yield* backlog(queue, 2)
        for (const [fn, call] of [
          ["claim_rated", sql`SELECT * FROM awa.claim_rated(${queue}, 5, 60000, 0, 0, 1)`],
          ["claim_rated", sql`SELECT * FROM awa.claim_rated(${queue}, 5, 60000, 0, 5, -1)`],
          [
            "claim_keyed_rated",
            sql`SELECT * FROM awa.claim_keyed_rated(${queue}, 'none', 5, 60000, 0, 100001, 1)`
          ]
        ] as const) {
          const pg = (yield* Effect.flip(call)).reason as { cause?: { code?: string; message?: string } }
          assert.strictEqual(pg.cause?.code, "22023")
          assert.include(pg.cause?.message, `${fn} needs 0 < rate <= 100000 and burst >= 0`)
        }
        const locks = yield* sql.withTransaction(
          Effect.andThen(
            sql`SELECT * FROM awa.claim_rated(${queue}, 0, 60000, 0, 5, 1)`,
            sql<{ n: number }>`
              SELECT count(*)::int AS n FROM pg_locks
              WHERE pid = pg_backend_pid() AND locktype = 'advisory'`
          )
        )
        assert.strictEqual(locks[0]!.n, 0, "no rate lock for a claim of 0")
        const taken = yield* sql<{
          n: number
        }>`SELECT count(*)::int AS n FROM awa.rate_marks WHERE queue = ${queue}`
        assert.strictEqual(taken[0]!.n, 0)
      })
    )
  })
})
