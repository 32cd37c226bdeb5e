/**
 * A rejected duplicate writes nothing to a ring child (storage-engine review m1 / A7): the unique
 * row is taken before the ready row, so the conflict aborts before any ring insert (an aborted
 * insert would leave a dead tuple in `ready_<slot>`, against the engine's zero-dead-tuple rule).
 */
import { TestDatabase } from "@awa/testing"
import { PgClient } from "@effect/sql-pg"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Layer, Redacted } from "effect"
import { SqlClient } from "effect/sql"
import { layer as pgLayer } from "../src/PgQueueStorage.ts"
import { QueueStorage } from "../src/QueueStorage.ts"
import { fresh } from "./pgFixtures.ts"

describe("PgQueueStorage: rejected duplicates", () => {
  it.live("three rejected duplicates insert no row into any ready child", () =>
    Effect.gen(function* () {
      const { url } = yield* TestDatabase.acquire()
      yield* Effect.gen(function* () {
        const storage = yield* QueueStorage
        const sql = yield* SqlClient.SqlClient
        const q = fresh("dup")
        const dup = { kind: "d", queue: q, args: { same: 1 }, unique: { byArgs: true } }
        yield* storage.enqueueMany([dup])
        // one connection: the counters below are this backend's, flushed on demand
        const inserted = Effect.gen(function* () {
          yield* sql`SELECT pg_stat_force_next_flush()`
          yield* sql`SELECT pg_stat_clear_snapshot()`
          const [row] = yield* sql<{ n: number }>`
            SELECT coalesce(sum(n_tup_ins), 0)::int AS n FROM pg_stat_user_tables
            WHERE schemaname = 'awa' AND relname LIKE 'ready\\_%'`
          return row!.n
        })
        const before = yield* inserted
        for (let i = 0; i < 3; i++) {
          const conflict = yield* Effect.flip(storage.enqueueMany([dup]))
          assert.strictEqual(conflict._tag, "UniqueConflict")
        }
        assert.strictEqual((yield* inserted) - before, 0)
      }).pipe(
        Effect.provide(
          pgLayer().pipe(Layer.provideMerge(PgClient.layer({ url: Redacted.make(url), maxConnections: 1 })))
        )
      )
    }).pipe(Effect.scoped)
  )
})
