/**
 * Unique masks on Postgres (issue 14 property 3): the shared mask contract, and 10 concurrent
 * producers × 100 inserts of one key on separate connections give exactly one live job.
 */
import { UniqueConflict } from "@awa/core"
import { TestDatabase } from "@awa/testing"
import { PgClient } from "@effect/sql-pg"
import { assert, describe, it, layer } from "@effect/vitest"
import { Effect, Layer, Redacted } from "effect"
import { SqlClient } from "effect/sql"
import { layer as pgLayer } from "../src/PgQueueStorage.ts"
import { QueueStorage } from "../src/QueueStorage.ts"
import { masksSuite } from "./contract/UniqueMasksContract.ts"
import { fresh } from "./pgFixtures.ts"

const StorageLive = pgLayer().pipe(Layer.provideMerge(TestDatabase.layer()))

describe("PgQueueStorage unique masks", () => {
  layer(StorageLive, { excludeTestServices: true, timeout: "60 seconds" })("mask contract", (it) => {
    masksSuite(it, { advance: (ms) => Effect.sleep(ms) })
  })

  it.live(
    "10 concurrent producers × 100 inserts of one key: 1 success, 999 conflicts naming it, 1 row",
    () =>
      Effect.gen(function* () {
        const { url } = yield* TestDatabase.acquire()
        const q = fresh("unique10x100")
        const producer = Effect.gen(function* () {
          const storage = yield* QueueStorage
          let ok = 0
          const holders = new Set<bigint>()
          for (let i = 0; i < 100; i++) {
            const r = yield* Effect.result(
              storage.enqueueMany([{ kind: "u", queue: q, args: { same: true }, unique: { byArgs: true } }])
            )
            if (r._tag === "Success") ok++
            else if (r.failure instanceof UniqueConflict) holders.add(r.failure.existingJobId)
            else return yield* Effect.die(r.failure)
          }
          return { ok, holders: [...holders] }
        }).pipe(
          Effect.provide(
            pgLayer().pipe(Layer.provideMerge(PgClient.layer({ url: Redacted.make(url), maxConnections: 1 })))
          )
        )
        const results = yield* Effect.all(
          Array.from({ length: 10 }, () => producer),
          { concurrency: 10 }
        )
        assert.strictEqual(
          results.reduce((a, r) => a + r.ok, 0),
          1
        )
        const holders = new Set(results.flatMap((r) => r.holders))
        assert.strictEqual(holders.size, 1)
        const [rows] = yield* Effect.gen(function* () {
          const sql = yield* SqlClient.SqlClient
          return yield* sql<{ n: number }>`SELECT count(*)::int AS n FROM awa.jobs WHERE queue = ${q}`
        }).pipe(Effect.provide(PgClient.layer({ url: Redacted.make(url), maxConnections: 1 })))
        assert.strictEqual(rows!.n, 1)
      }).pipe(Effect.scoped),
    120_000
  )
})
