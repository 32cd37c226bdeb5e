/**
 * Storage rules that only the simulation tested before (capability audit, test concerns 2 and 5),
 * now on Postgres: a job's error history keeps its newest 100 entries (`append_error`), and
 * `prune_history` keeps a history slot while it holds a row younger than the retention
 * (`Blocked:retention`), reclaiming it once the retention allows.
 */
import { TestDatabase } from "@awa/testing"
import { PgClient } from "@effect/sql-pg"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Layer, Redacted, type Scope } from "effect"
import { SqlClient } from "effect/sql"
import { layer as pgLayer } from "../src/PgQueueStorage.ts"
import { type PruneOutcome, QueueStorage } from "../src/QueueStorage.ts"
import { claimOf, completeAll, day, fresh, keepNothing } from "./pgFixtures.ts"

const withDatabase = <A, E>(
  body: Effect.Effect<A, E, QueueStorage | PgClient.PgClient | SqlClient.SqlClient | Scope.Scope>
) =>
  Effect.flatMap(TestDatabase.acquire(), ({ url }) =>
    body.pipe(
      Effect.provide(
        pgLayer({ rotateMinRows: 1, pruneCarryAfterMs: 0 }).pipe(
          Layer.provideMerge(PgClient.layer({ url: Redacted.make(url), maxConnections: 4 }))
        )
      )
    )
  )

describe("PgQueueStorage: error history cap and history retention", () => {
  it.live("a job's error history keeps its newest 100 entries", () =>
    withDatabase(
      Effect.gen(function* () {
        const storage = yield* QueueStorage
        const queue = fresh("errors")
        const [job] = yield* storage.enqueueMany([{ kind: "k", queue, args: {}, maxAttempts: 1000 }])
        for (let attempt = 1; attempt <= 105; attempt++) {
          const [claimed] = yield* storage.claim(claimOf(queue, 1))
          assert.strictEqual(claimed!.attempt, attempt)
          yield* storage.finalizeMany([
            {
              jobId: claimed!.jobId,
              runLease: claimed!.runLease,
              outcome: { _tag: "Retry", delayMs: 0, error: `failure ${attempt}` }
            }
          ])
          yield* storage.promoteDue(10)
        }
        const view = yield* storage.getJob(job!.id)
        assert.strictEqual(view.errors.length, 100)
        assert.deepStrictEqual(
          [
            view.errors[0]!.error,
            view.errors[0]!.attempt,
            view.errors.at(-1)!.error,
            view.errors.at(-1)!.attempt
          ],
          ["failure 6", 6, "failure 105", 105]
        )
      })
    )
  )

  it.live("history with a nonzero retention is Blocked:retention until it expires, then reclaimed", () =>
    withDatabase(
      Effect.gen(function* () {
        const storage = yield* QueueStorage
        const sql = yield* SqlClient.SqlClient
        const queue = fresh("history")
        const keepADay = { completedMs: day, failedMs: day, cancelledMs: day }
        const [job] = yield* storage.enqueueMany([{ kind: "k", queue, args: {} }])
        yield* completeAll(yield* storage.claim(claimOf(queue, 1)))
        // rotate and prune the queue ring until its prune has copied the completed row to history
        const inHistory = Effect.map(
          sql<{ n: number }>`SELECT count(*)::int AS n FROM awa.history WHERE job_id = ${job!.id}`,
          (rows) => rows[0]!.n === 1
        )
        for (let i = 0; i < 40 && !(yield* inHistory); i++) {
          yield* storage.rotate
          for (let k = 0; k < 32 && (yield* storage.prune(keepADay))._tag === "Pruned"; k++);
        }
        assert.isTrue(yield* inHistory, "the completed row reached the history ring")
        // seal its history slot, then prune with a day of retention: the guard holds it
        assert.strictEqual(yield* storage.rotateHistory(0), "Rotated")
        let outcome: PruneOutcome = { _tag: "Noop" }
        for (let i = 0; i < 16; i++) {
          outcome = yield* storage.pruneHistory(keepADay)
          if (outcome._tag !== "Pruned") break
        }
        assert.deepStrictEqual(outcome, { _tag: "Blocked", reason: "retention" })
        assert.strictEqual((yield* storage.getJob(job!.id)).state, "completed", "still visible")
        // the same call with the retention over (none) reclaims it by TRUNCATE
        for (let i = 0; i < 16 && (yield* inHistory); i++) yield* storage.pruneHistory(keepNothing)
        assert.isFalse(yield* inHistory)
        assert.strictEqual((yield* Effect.flip(storage.getJob(job!.id)))._tag, "JobNotFound")
      })
    )
  )
})
