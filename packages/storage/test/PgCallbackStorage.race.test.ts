/**
 * At most one resolution per callback on Postgres, with the resolvers made to overlap: another
 * session holds the callback's attempt_state row, so every resolver that gets past its checks
 * queues on that row. With the per-attempt lock (migration 0034's lock_attempt, the claims row)
 * only the first gets that far and the other nine wait for it, then see its resume: one winner.
 * Without it, all ten pass the check and each applies its resume once the row is free.
 */
import { PgClient } from "@effect/sql-pg"
import { assert, describe, it } from "@effect/vitest"
import { Deferred, Effect, Fiber, Option, Redacted } from "effect"
import { SqlClient } from "effect/sql"
import { CallbackStorage } from "../src/CallbackStorage.ts"
import { layer as callbackLayer } from "../src/PgCallbackStorage.ts"
import { QueueStorage } from "../src/QueueStorage.ts"
import { claimOf, fresh, holdOpenUntil, withEagerDatabase } from "./pgFixtures.ts"

describe("callback resolution under contention", () => {
  it.live(
    "10 resumes queued behind a held attempt_state row: exactly one wins",
    () =>
      withEagerDatabase({}, (url) =>
        Effect.gen(function* () {
          const storage = yield* QueueStorage
          const callbacks = yield* CallbackStorage
          const sql = yield* SqlClient.SqlClient
          const q = fresh("race-held")
          yield* storage.enqueueMany([{ kind: "r", queue: q, args: {} }])
          const [job] = yield* storage.claim(claimOf(q, 1))
          const id = Option.getOrThrow(yield* callbacks.register(job!, { timeoutMs: 60_000 }))
          yield* callbacks.park(job!, id)

          const release = yield* Deferred.make<void>()
          const holder = yield* holdOpenUntil(
            url,
            `SELECT 1 FROM awa.attempt_state WHERE job_id = ${job!.jobId} FOR UPDATE /* race holder */`,
            release
          )
          const resolvers = yield* Effect.forkChild(
            Effect.all(
              Array.from({ length: 10 }, (_, i) =>
                // its own service on its own pool: the test's pool stays free for the watcher
                Effect.result(
                  Effect.flatMap(Effect.service(CallbackStorage), (c) =>
                    c.resolve(id, { _tag: "Resume", payload: i })
                  )
                ).pipe(Effect.provide(callbackLayer()), Effect.provide(eagerStorageClient(url)))
              ),
              { concurrency: "unbounded" }
            ),
            { startImmediately: true }
          )
          // all ten wait on a lock (which one depends on the build under test)
          for (let i = 0; i < 400; i++) {
            const [row] = yield* sql<{ n: number }>`
              SELECT count(*)::int AS n FROM pg_stat_activity
              WHERE wait_event_type = 'Lock' AND query LIKE '%resolve_callback%'`
            if (row!.n >= 10) break
            yield* Effect.sleep("25 millis")
          }
          yield* Deferred.succeed(release, undefined)
          yield* Fiber.join(holder)
          const results = yield* Fiber.join(resolvers)
          const wins = results.filter((r) => r._tag === "Success").length
          assert.strictEqual(wins, 1)
          for (const r of results)
            if (r._tag === "Failure") assert.strictEqual(r.failure._tag, "CallbackStale")
        }).pipe(Effect.provide(callbackLayer()))
      ),
    60_000
  )
})

/** A pool of its own per resolver, so the ten really run at once. */
const eagerStorageClient = (url: string) => PgClient.layer({ url: Redacted.make(url), maxConnections: 1 })
