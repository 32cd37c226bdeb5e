/**
 * Idle dispatchers that listen poll rarely (issue 14, property 5), so every way a queue gets
 * claimable work must send a wake-up. Resuming a paused queue is one: its jobs' wake-ups were
 * sent (and ignored) while it was paused.
 */
import { TestDatabase } from "@awa/testing"
import { PgClient } from "@effect/sql-pg"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Layer, Queue } from "effect"
import { layer as pgLayer } from "../src/PgQueueStorage.ts"
import { QueueStorage } from "../src/QueueStorage.ts"
import { fresh } from "./pgFixtures.ts"

const StorageLive = pgLayer().pipe(Layer.provideMerge(TestDatabase.layer()))

describe("PgQueueStorage wake-ups", () => {
  it.live("resuming a queue wakes its workers", () =>
    Effect.scoped(
      Effect.gen(function* () {
        const sql = yield* PgClient.PgClient
        const storage = yield* QueueStorage
        const q = fresh("resume")
        yield* storage.pauseQueue(q)
        yield* storage.enqueueMany([{ kind: "k", queue: q, args: {} }])
        const wakes = yield* sql.listen("awa_wake_awa")
        yield* storage.pauseQueue(q)
        yield* storage.resumeQueue(q)
        // delivered on commit; the pause sent none, the resume one
        const note = yield* Queue.take(wakes)
        assert.strictEqual(note.payload, q)
        assert.strictEqual(yield* Queue.size(wakes), 0)
      })
    ).pipe(Effect.provide(StorageLive))
  )
})
