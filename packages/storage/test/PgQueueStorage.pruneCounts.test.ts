/**
 * Prune counts before it anti-joins (migration 0044): a sealed slot whose claims and closures
 * counts are equal has no open attempt, so prune skips its young test, its row locks and its
 * open-attempts read. These tests hold the cases where counting could go wrong: an attempt
 * claimed after the first count (it must be carried, not truncated), and open attempts beside
 * closed ones.
 */
import { TestDatabase } from "@awa/testing"
import { assert, describe, it } from "@effect/vitest"
import { Deferred, Effect, Fiber } from "effect"
import { SqlClient } from "effect/sql"
import { QueueStorage } from "../src/QueueStorage.ts"
import { claimOf, completeAll, eagerStorage, fresh, holdOpenUntil, keepNothing } from "./pgFixtures.ts"

const job = (queue: string, n: number) => ({ kind: "prune_counts", queue, args: { n } })

/** Waits until a session of this database runs a statement containing `text` and waits for a lock. */
const untilWaitingForLock = (text: string) =>
  Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    const waiting = sql<{ n: number }>`
      SELECT count(*)::int AS n FROM pg_stat_activity
      WHERE datname = current_database() AND pid <> pg_backend_pid() AND query LIKE ${`%${text}%`}
        AND wait_event_type = 'Lock'`
    while ((yield* waiting)[0]!.n === 0) yield* Effect.sleep("5 millis")
  })

/** Prunes until the ring's sealed slots are gone (the queue's earlier rows out of the way). */
const pruneAll = Effect.gen(function* () {
  const storage = yield* QueueStorage
  for (let i = 0; i < 20; i++) {
    yield* storage.rotate
    while ((yield* storage.prune(keepNothing))._tag === "Pruned");
  }
})

const withDatabase = <A, E>(body: (url: string) => Effect.Effect<A, E, QueueStorage | SqlClient.SqlClient>) =>
  Effect.flatMap(TestDatabase.acquire(), ({ url }) => body(url).pipe(Effect.provide(eagerStorage(url, 2))))

describe("prune counts the slot's attempts before it looks for open ones (0044)", () => {
  it.live(
    "an attempt claimed from the sealed slot while prune waits to freeze it is carried, and its completion applies",
    () =>
      withDatabase((url) =>
        Effect.gen(function* () {
          const storage = yield* QueueStorage
          const sql = yield* SqlClient.SqlClient
          const q = fresh("late")
          yield* pruneAll
          const ids = (yield* storage.enqueueMany([job(q, 0), job(q, 1), job(q, 2)])).map((x) => x.id)
          // two of the three complete; the third stays ready in the slot, which is then sealed
          yield* completeAll(yield* storage.claim(claimOf(q, 2)))
          assert.strictEqual(yield* storage.rotate, "Rotated")
          // a claimer takes the third from the sealed slot (its claims row goes into that slot)
          // and has not committed: prune's first count sees 2 claims and 2 closures
          const committed = yield* Deferred.make<void>()
          const claimer = yield* holdOpenUntil(url, `SELECT * FROM awa.claim('${q}', 1, 0, 0)`, committed)
          const pruning = yield* QueueStorage.pipe(
            Effect.flatMap((s) => s.prune({ ...keepNothing, forceLockTimeoutMs: 5000 })),
            Effect.forkChild({ startImmediately: true })
          )
          // prune waits for the claimer's lock on the slot's claims child (its freeze); the claim
          // commits, and prune's count after the freeze must see the open attempt
          yield* untilWaitingForLock("prune_queue")
          yield* Deferred.succeed(committed, undefined)
          yield* Fiber.join(claimer)
          const pruned = yield* Fiber.join(pruning)
          assert.deepStrictEqual(
            pruned._tag === "Pruned" ? pruned.carried : pruned,
            1,
            "the attempt claimed during the prune was carried"
          )
          // the carried attempt is still open and its completion applies (truncated with its
          // slot, it would be Stale and the job lost)
          const [finalized] = yield* storage.finalizeMany([
            { jobId: ids[2]!, runLease: 1n, outcome: { _tag: "Complete" } }
          ])
          assert.strictEqual(finalized?._tag, "Applied")
          const states = yield* sql<{ state: string }>`
            SELECT state FROM awa.jobs WHERE queue = ${q} AND job_id = ${ids[2]!}`
          assert.deepStrictEqual(
            states.map((s) => s.state),
            ["completed"]
          )
        })
      )
  )

  it.live("open attempts beside closed ones are carried; a slot of closed attempts carries none", () =>
    withDatabase(() =>
      Effect.gen(function* () {
        const storage = yield* QueueStorage
        const q = fresh("mixed")
        yield* pruneAll
        yield* storage.enqueueMany(Array.from({ length: 10 }, (_, i) => job(q, i)))
        const claimed = yield* storage.claim(claimOf(q, 10))
        // 7 complete, 3 stay open
        yield* completeAll(claimed.slice(0, 7))
        assert.strictEqual(yield* storage.rotate, "Rotated")
        const pruned = yield* storage.prune(keepNothing)
        assert.deepStrictEqual(pruned._tag === "Pruned" ? pruned.carried : pruned, 3)
        // the three complete after the carry
        const results = yield* storage.finalizeMany(
          claimed
            .slice(7)
            .map((c) => ({ jobId: c.jobId, runLease: c.runLease, outcome: { _tag: "Complete" as const } }))
        )
        assert.deepStrictEqual(
          results.map((r) => r._tag),
          ["Applied", "Applied", "Applied"]
        )
        // a slot whose attempts are all closed: nothing carried
        yield* storage.enqueueMany(Array.from({ length: 5 }, (_, i) => job(q, 10 + i)))
        yield* completeAll(yield* storage.claim(claimOf(q, 5)))
        yield* pruneAll
        assert.strictEqual((yield* storage.prune(keepNothing))._tag, "Noop")
      })
    )
  )
})
