/**
 * A parked attempt is an open attempt for the ring (storage-engine.md §7.4, §16; migration 0034):
 * prune carries its claim and ready row forward like any long attempt, so the ring keeps wrapping
 * while it waits, and the callback still resolves it afterwards.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect, Option } from "effect"
import { SqlClient } from "effect/sql"
import { CallbackStorage } from "../src/CallbackStorage.ts"
import { layer as callbackLayer } from "../src/PgCallbackStorage.ts"
import { QueueStorage } from "../src/QueueStorage.ts"
import { claimOf, completeAll, fresh, keepAll, withEagerDatabase } from "./pgFixtures.ts"

describe("parked attempts and the ring", () => {
  it.live(
    "the ring wraps twice while a job is parked; its claim is carried and the callback completes it",
    () =>
      withEagerDatabase({}, () =>
        Effect.gen(function* () {
          const storage = yield* QueueStorage
          const callbacks = yield* CallbackStorage
          const sql = yield* SqlClient.SqlClient
          const parkedQueue = fresh("parked")
          const busy = fresh("busy")
          yield* storage.enqueueMany([{ kind: "wait", queue: parkedQueue, args: {} }])
          const [job] = yield* storage.claim(claimOf(parkedQueue, 1))
          const id = Option.getOrThrow(yield* callbacks.register(job!, { timeoutMs: 3_600_000 }))
          assert.deepStrictEqual(yield* callbacks.park(job!, id), { _tag: "Parked" })
          const slotOf = Effect.map(
            sql<{ slot: number; generation: string }>`
              SELECT slot, generation::text FROM awa.claims WHERE job_id = ${job!.jobId} AND run_lease = ${job!.runLease}`,
            (rows) => rows.map((r) => `${r.slot}/${r.generation}`)
          )
          const before = yield* slotOf
          const start = (yield* storage.status).generation
          let pruned = 0
          for (let i = 0; i < 200 && (yield* storage.status).generation < start + 34n; i++) {
            yield* storage.enqueueMany([1, 2, 3].map((n) => ({ kind: "b", queue: busy, args: { n } })))
            yield* completeAll(yield* storage.claim(claimOf(busy, 10)))
            yield* storage.rotate
            for (let k = 0; k < 4; k++) {
              const outcome = yield* storage.prune({ ...keepAll, carryAfterMs: 0 })
              if (outcome._tag !== "Pruned") break
              pruned++
            }
          }
          assert.isTrue((yield* storage.status).generation >= start + 34n, "the ring wrapped twice")
          assert.isTrue(pruned >= 32, `pruned ${pruned}`)
          const after = yield* slotOf
          assert.strictEqual(after.length, 1, "one claims row, carried")
          assert.notStrictEqual(after[0], before[0])
          assert.strictEqual((yield* storage.getJob(job!.jobId)).state, "waiting_external")
          const done = yield* callbacks.resolve(id, { _tag: "Complete" })
          assert.strictEqual(done.state, "completed")
          assert.strictEqual((yield* storage.getJob(job!.jobId)).state, "completed")
        }).pipe(Effect.provide(callbackLayer()))
      ),
    120_000
  )
})
