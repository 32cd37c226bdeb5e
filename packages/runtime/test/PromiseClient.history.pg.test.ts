/**
 * The Promise facade's sampled reads (migration 0031): `queueHistory` returns the leader's
 * samples per queue and bucket, `queueStats` their rates, and `status` each ring's recorded prune
 * state. The samples are taken here through SQL, as the leader's duty does.
 */
import { TestDatabase } from "@awa/testing"
import { PgClient } from "@effect/sql-pg"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Redacted, Schema } from "effect"
import { createClient } from "../src/PromiseClient.ts"

describe("Promise facade: sampled statistics", () => {
  it.live("queueHistory, rates in queueStats, prune state in status", () =>
    Effect.flatMap(TestDatabase.acquire(), ({ url }) =>
      Effect.gen(function* () {
        const sql = yield* PgClient.PgClient
        const sample = sql`SELECT awa.sample_queue_stats(0, 7200000)`
        yield* sample
        const awa = yield* Effect.promise(() => createClient({ databaseUrl: url }))
        const Ping = awa.define({
          kind: "ping",
          args: Schema.Struct({ n: Schema.Number }),
          queue: "facade-rates"
        })
        yield* Effect.promise(() => awa.insertMany(Ping, [{ n: 1 }, { n: 2 }]))
        yield* sample
        yield* sample
        yield* sql`SELECT awa.record_prune_state('queue', 'blocked', 'unclaimed')`
        const [history, stats, status] = yield* Effect.promise(() =>
          Promise.all([awa.queueHistory(), awa.queueStats({ windowMs: 3_600_000 }), awa.status()]).finally(
            () => awa.close()
          )
        )
        const mine = history.queues.find((q) => q.queue === "facade-rates")
        assert.strictEqual(
          mine?.buckets.reduce((n, b) => n + b.enqueued, 0),
          2
        )
        assert.strictEqual(stats.queues.find((q) => q.queue === "facade-rates")?.rates?.enqueued, 2)
        assert.deepStrictEqual(
          [status.rings[0]?.prune?.outcome, status.rings[0]?.prune?.reason],
          ["blocked", "unclaimed"]
        )
      }).pipe(Effect.provide(PgClient.layer({ url: Redacted.make(url), maxConnections: 1 })))
    )
  )
})
