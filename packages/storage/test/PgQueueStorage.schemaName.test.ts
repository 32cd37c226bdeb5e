/**
 * An install in a schema with another name prunes its own queue ring, and only its own.
 *
 * What would break: prune_queue spelled the default schema's name in its dynamic statements
 * (0039-0052: LOCK and TRUNCATE of the slot's children, the terminal count; fixed by 0053). In a
 * database that also holds an install named `awa`, a prune of the other install locked and
 * truncated `awa`'s slot: its waiting jobs were gone, and its own slot kept every row. Seen to fail
 * on 0052's prune_queue (the default install's three jobs were lost).
 */
import { Migrations } from "@awa/sql"
import { TestDatabase } from "@awa/testing"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { SqlClient } from "effect/sql"
import { QueueStorage } from "../src/QueueStorage.ts"
import { claimOf, completeAll, eagerStorage, keepNothing } from "./pgFixtures.ts"

const other = "jobs_other"

describe("a schema with another name", () => {
  it.live("prunes its own ring and leaves the default schema's install alone", () =>
    Effect.gen(function* () {
      const { url } = yield* TestDatabase.acquire()
      const inDefault = <A, E>(body: Effect.Effect<A, E, QueueStorage | SqlClient.SqlClient>) =>
        Effect.provide(body, eagerStorage(url, 1), { local: true })
      const inOther = <A, E>(body: Effect.Effect<A, E, QueueStorage | SqlClient.SqlClient>) =>
        Effect.provide(body, eagerStorage(url, 1, { schema: other }), { local: true })
      yield* inDefault(Migrations.migrate({ schema: other }))
      // waiting jobs of the default install, in its current slot (the same number as the other's)
      yield* inDefault(
        Effect.flatMap(QueueStorage, (s) =>
          s.enqueueMany(Array.from({ length: 3 }, (_, n) => ({ kind: "k", queue: "q", args: { n } })))
        )
      )
      const pruned = yield* inOther(
        Effect.gen(function* () {
          const storage = yield* QueueStorage
          yield* storage.enqueueMany(
            Array.from({ length: 3 }, (_, n) => ({ kind: "k", queue: "q", args: { n } }))
          )
          yield* completeAll(yield* storage.claim(claimOf("q", 10)))
          assert.strictEqual(yield* storage.rotate, "Rotated")
          return yield* storage.prune(keepNothing)
        })
      )
      assert.strictEqual(pruned._tag, "Pruned")
      const waiting = yield* inDefault(Effect.flatMap(QueueStorage, (s) => s.claim(claimOf("q", 10))))
      assert.strictEqual(waiting.length, 3)
      const otherRows = yield* inOther(
        Effect.flatMap(
          SqlClient.SqlClient,
          (sql) =>
            sql<{ n: number }>`
            SELECT (SELECT count(*) FROM ${sql(other)}.ready) + (SELECT count(*) FROM ${sql(other)}.claims)
                   + (SELECT count(*) FROM ${sql(other)}.claim_spans) + (SELECT count(*) FROM ${sql(other)}.terminal) AS n`
        )
      )
      assert.strictEqual(Number(otherRows[0]!.n), 0)
    })
  )
})
