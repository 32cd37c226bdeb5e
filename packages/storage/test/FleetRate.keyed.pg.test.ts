/**
 * A keyed queue under a fleet-wide rate limit on Postgres (migration 0045,
 * docs/adr/0036-fleet-rate-limit.md, "Keyed queues"): the keyed claim takes at most the tokens
 * there are (burst, then `Throttled` with the next token's time); a job the keys gate takes no
 * token; a rolled-back claim gives its tokens back; plain and keyed rated claims of a queue share
 * one budget; concurrent keyed claimers never exceed `burst + rate × W` nor a key's limit.
 */
import { TestDatabase } from "@awa/testing"
import { assert, describe, layer } from "@effect/vitest"
import { Effect, Exit, Layer } from "effect"
import { SqlClient } from "effect/sql"
import { FlowStorage, layerPg as flowLayer } from "../src/FlowStorage.ts"
import { type KeyedClaim, KeyGrants } from "../src/KeyGrants.ts"
import { layer as grantsLayer } from "../src/PgKeyGrants.ts"
import { layer as pgLayer } from "../src/PgQueueStorage.ts"
import { type ClaimedJob, QueueStorage } from "../src/QueueStorage.ts"
import { claimOf, fresh } from "./pgFixtures.ts"

/** `n` jobs of `queue`, job i keyed `keyOf(i)`. */
const backlog = (queue: string, n: number, keyOf: (i: number) => string) =>
  Effect.flatMap(QueueStorage, (s) =>
    s.enqueueMany(
      Array.from({ length: n }, (_, i) => ({ kind: "rated", queue, args: { i }, concurrencyKey: keyOf(i) }))
    )
  )

const keyedRated = (queue: string, policy: string, max: number, maxRate: number, burst: number) =>
  Effect.flatMap(KeyGrants, (g) => g.claim({ ...claimOf(queue, max), policy, rate: { maxRate, burst } }))

const jobsOf = (c: KeyedClaim): ReadonlyArray<ClaimedJob> => (c._tag === "Claimed" ? c.jobs : [])

const complete = (jobs: ReadonlyArray<ClaimedJob>) =>
  Effect.flatMap(QueueStorage, (s) =>
    s.finalizeMany(
      jobs.map((c) => ({ jobId: c.jobId, runLease: c.runLease, outcome: { _tag: "Complete" as const } }))
    )
  )

/** Waits (real time) until `at`: the condition is the clock itself. */
const until = (at: Date) => Effect.sleep(Math.max(0, at.getTime() - Date.now() + 5))

describe("a keyed queue under a fleet-wide rate limit on Postgres (0045)", () => {
  layer(
    Layer.mergeAll(pgLayer(), flowLayer(), grantsLayer()).pipe(
      Layer.provideMerge(TestDatabase.layer({ maxConnections: 8 }))
    ),
    { excludeTestServices: true, timeout: "120 seconds" }
  )((it) => {
    it.effect(
      "burst, then Throttled with the next token's time; a rolled-back claim gives its tokens back",
      () =>
        Effect.gen(function* () {
          const grants = yield* KeyGrants
          const queue = fresh("krated")
          const policy = fresh("p")
          yield* grants.create({ id: policy, maxInFlight: 1 })
          yield* backlog(queue, 20, (i) => `k${i}`)
          // one token every 20 s: no machine earns one between these two claims
          const first = yield* keyedRated(queue, policy, 20, 0.05, 5)
          assert.strictEqual(first._tag, "Claimed")
          assert.strictEqual(jobsOf(first).length, 5, "the burst")
          assert.isDefined(first._tag === "Claimed" ? first.nextTokenAt : undefined, "cut short by the rate")
          const second = yield* keyedRated(queue, policy, 20, 0.05, 5)
          assert.strictEqual(second._tag, "Throttled")
          const next = second._tag === "Throttled" ? second.nextTokenAt : new Date(0)
          // 5 tokens taken at t (the first claim's transaction start), the next one 20 s later
          assert.isAtMost(next.getTime() - Date.now(), 20_010)
          assert.isAtLeast(next.getTime() - Date.now(), 15_000)
          // another queue, burst 1: the token of a rolled-back claim is there afterwards (were it
          // not, the claim after it would be Throttled for 20 s)
          const other = fresh("krated")
          yield* backlog(other, 5, (i) => `other-${i}`)
          const sql = yield* SqlClient.SqlClient
          const rolledBack = yield* Effect.exit(
            sql.withTransaction(
              Effect.andThen(
                Effect.tap(keyedRated(other, policy, 1, 0.05, 1), (c) =>
                  Effect.sync(() => assert.strictEqual(jobsOf(c).length, 1))
                ),
                Effect.fail("roll back" as const)
              )
            )
          )
          assert.isTrue(Exit.isFailure(rolledBack))
          const third = yield* keyedRated(other, policy, 1, 0.05, 1)
          assert.strictEqual(jobsOf(third).length, 1, "the rolled-back claim's token came back")
        })
    )

    it.effect("a job the keys gate takes no token; plain and keyed rated claims share one budget", () =>
      Effect.gen(function* () {
        const grants = yield* KeyGrants
        const flow = yield* FlowStorage
        const queue = fresh("krated")
        const policy = fresh("p")
        yield* grants.create({ id: policy, maxInFlight: 1 })
        // a, a, b, c, d, e, f: the second a waits for the first
        yield* backlog(queue, 7, (i) => (i <= 1 ? "a" : String.fromCharCode(97 + i - 1)))
        const gated = yield* keyedRated(queue, policy, 20, 1, 5)
        assert.strictEqual(jobsOf(gated).length, 1)
        assert.strictEqual(gated._tag === "Claimed" ? gated.blocked : undefined, "gated")
        assert.isUndefined(
          gated._tag === "Claimed" ? gated.nextTokenAt : "x",
          "the keys, not the rate, stopped it"
        )
        yield* complete(jobsOf(gated))
        // 4 tokens left of the burst of 5: the keyed claim takes 4 (a, b, c, d) and is cut by the rate
        const cut = yield* keyedRated(queue, policy, 20, 1, 5)
        assert.strictEqual(jobsOf(cut).length, 4)
        assert.isDefined(cut._tag === "Claimed" ? cut.nextTokenAt : undefined)
        // the plain rated claim of the same queue finds the budget spent
        const plain = yield* flow.claimRated({ ...claimOf(queue, 20), rate: { maxRate: 1, burst: 5 } })
        assert.strictEqual(plain.jobs.length, 0)
        assert.isDefined(plain.nextTokenAt)
      })
    )

    it.effect("concurrent keyed claimers never exceed burst + rate × W, nor a key's limit", () =>
      Effect.gen(function* () {
        const grants = yield* KeyGrants
        const queue = fresh("krated")
        const policy = fresh("p")
        const maxInFlight = 2
        yield* grants.create({ id: policy, maxInFlight })
        yield* backlog(queue, 2000, (i) => `k${i % 50}`)
        const maxRate = 40
        const burst = 4
        const endAt = Date.now() + 1500
        const sql = yield* SqlClient.SqlClient
        let overLimit = 0
        const claimer = Effect.gen(function* () {
          let taken = 0
          while (Date.now() < endAt) {
            const c = yield* keyedRated(queue, policy, 10, maxRate, burst)
            const jobs = jobsOf(c)
            taken += jobs.length
            // no key over its limit while these grants are open
            const [worst] = yield* sql<{ n: number }>`
              SELECT coalesce(max(n), 0)::int AS n FROM (
                SELECT count(*) AS n FROM awa.claims c
                WHERE c.queue = ${queue}
                  AND NOT EXISTS (SELECT 1 FROM awa.closures x WHERE x.job_id = c.job_id AND x.run_lease = c.run_lease)
                GROUP BY c.key_digest) g`
            if (worst!.n > maxInFlight) overLimit++
            yield* complete(jobs)
            if (c._tag === "Throttled") yield* until(c.nextTokenAt)
          }
          return taken
        })
        const taken = yield* Effect.all([claimer, claimer, claimer, claimer], { concurrency: "unbounded" })
        const rows = yield* sql<{ t: number }>`
          SELECT extract(epoch FROM c.claimed_at)::float8 AS t FROM awa.claims c WHERE c.queue = ${queue} ORDER BY 1`
        const at = rows.map((r) => r.t)
        assert.strictEqual(
          at.length,
          taken.reduce((a, b) => a + b, 0)
        )
        assert.isAtLeast(at.length, burst + 10, "the claimers got jobs")
        assert.strictEqual(overLimit, 0, "a key held more than its limit")
        let worst = Number.NEGATIVE_INFINITY
        for (let i = 0; i < at.length; i++)
          for (let j = i; j < at.length; j++)
            worst = Math.max(worst, j - i + 1 - (burst + maxRate * (at[j]! - at[i]!)))
        assert.isAtMost(worst, 1e-6, `${at.length} claims: a window exceeded burst + rate × W by ${worst}`)
      })
    )
  })
})
