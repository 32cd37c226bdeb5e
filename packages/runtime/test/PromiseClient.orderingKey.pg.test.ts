/**
 * Sharded queues through the Promise facade on Postgres (capabilities.md §22, ADR 0034): a
 * definition's `orderingKey` keys each job of one `insertMany` by its args, so in a sharded queue
 * one user's jobs share a shard while the batch spreads over several; an insert's own
 * `orderingKey` wins; a throwing function rejects the batch with a `ValidationError`, nothing
 * written; `setEnqueueShards` out of range rejects the same way.
 */
import { ValidationError } from "@awa/core"
import { TestDatabase } from "@awa/testing"
import { PgClient } from "@effect/sql-pg"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Redacted, Schema } from "effect"
import { SqlClient } from "effect/sql"
import { createClient } from "../src/PromiseClient.ts"

/** Each stored job's user, ordering key and shard, in id order. */
const stored = (url: string, queue: string) =>
  Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    return yield* sql<{ user: string; k: string | null; shard: number }>`
      SELECT r.args ->> 'user' AS user, r.metadata ->> 'awa:orderingKey' AS k, r.shard
      FROM awa.ready r WHERE r.queue = ${queue} ORDER BY r.job_id`
  }).pipe(Effect.provide(PgClient.layer({ url: Redacted.make(url), maxConnections: 1 })))

const rejection = (p: Promise<unknown>) =>
  Effect.promise(() =>
    p.then(
      () => undefined,
      (e: unknown) => e
    )
  )

describe("Promise facade: sharded queues and a definition's orderingKey", () => {
  it.live("one insertMany spreads users over shards, each user's jobs in one; bad input writes nothing", () =>
    Effect.gen(function* () {
      const { url } = yield* TestDatabase.acquire()
      const awa = yield* Effect.promise(() => createClient({ databaseUrl: url }))
      try {
        yield* Effect.promise(() => awa.setEnqueueShards("events", 8))
        const Event = awa.define({
          kind: "user-event",
          args: Schema.Struct({ user: Schema.String }),
          queue: "events",
          orderingKey: ({ user }) => (user === "-" ? undefined : `user:${user}`)
        })
        const users = ["a", "b", "c", "d", "e", "f", "a", "b", "c", "d", "e", "f", "-"]
        yield* Effect.promise(() =>
          awa.insertMany(
            Event,
            users.map((user) => ({ user }))
          )
        )
        const rows = yield* stored(url, "events")
        assert.deepStrictEqual(
          rows.map((r) => r.k),
          users.map((u) => (u === "-" ? null : `user:${u}`))
        )
        const shardOf = new Map<string, number>()
        for (const r of rows.filter((r) => r.k !== null)) {
          assert.strictEqual(shardOf.get(r.user) ?? r.shard, r.shard, `user ${r.user} split over shards`)
          shardOf.set(r.user, r.shard)
        }
        assert.isAbove(new Set(shardOf.values()).size, 1, "six users all in one shard")
        // an insert's own key wins over the definition's
        yield* Effect.promise(() => awa.insert(Event, { user: "z" }, { orderingKey: "user:a" }))
        const last = (yield* stored(url, "events")).at(-1)!
        assert.deepStrictEqual([last.k, last.shard], ["user:a", shardOf.get("a")])

        const Throwing = awa.define({
          kind: "user-event",
          args: Schema.Struct({ user: Schema.String }),
          queue: "events",
          orderingKey: ({ user }) => {
            if (user === "?") throw new Error("unknown user")
            return user
          }
        })
        const thrown = yield* rejection(awa.insertMany(Throwing, [{ user: "x" }, { user: "?" }]))
        assert.instanceOf(thrown, ValidationError)
        assert.strictEqual((thrown as ValidationError).field, "orderingKey")
        assert.include((thrown as ValidationError).reason, "unknown user")
        const tooWide = yield* rejection(awa.setEnqueueShards("events", 65))
        assert.instanceOf(tooWide, ValidationError)
        assert.strictEqual((yield* stored(url, "events")).length, users.length + 1, "nothing written")
      } finally {
        yield* Effect.promise(() => awa.close())
      }
    })
  )
})
