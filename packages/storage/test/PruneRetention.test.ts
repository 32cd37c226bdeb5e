/**
 * A queue's own retention (queue_meta.completed_retention) overrides the prune's argument when
 * the queue ring's slot is judged (0039 joins queue_meta once instead of calling retention() per
 * row): a queue that keeps nothing loses its completed jobs at prune, its neighbour keeps them.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { SqlClient } from "effect/sql"
import { QueueStorage } from "../src/QueueStorage.ts"
import { claimOf, completeAll, fresh, keepAll, withEagerDatabase } from "./pgFixtures.ts"

describe("prune: per-queue retention", () => {
  it.live(
    "a queue whose completed retention is 0 keeps no history; the argument's day holds for the other",
    () =>
      withEagerDatabase({}, () =>
        Effect.gen(function* () {
          const storage = yield* QueueStorage
          const sql = yield* SqlClient.SqlClient
          const [keeps, drops] = [fresh("ret-keep"), fresh("ret-drop")]
          yield* sql`INSERT INTO awa.queue_meta (queue, completed_retention) VALUES (${drops}, interval '0')`
          const ids: Array<bigint> = []
          for (const q of [keeps, drops]) {
            yield* storage.enqueueMany([0, 1, 2].map((n) => ({ kind: "k", queue: q, args: { n } })))
            const claimed = yield* storage.claim(claimOf(q, 3))
            ids.push(...claimed.map((c) => c.jobId))
            yield* completeAll(claimed)
          }
          yield* storage.rotateWhenDue({ minRows: 1, maxAgeMs: 0 })
          // the first call may copy the slot's kept rows ahead ('Copied'); prune until the slot is gone
          for (let i = 0; i < 5; i++) {
            const outcome = yield* storage.prune({ ...keepAll, carryAfterMs: 0 })
            if (outcome._tag === "Pruned") break
          }
          const rows = yield* sql<{ queue: string; n: number }>`
          SELECT queue, count(*)::int AS n FROM awa.history WHERE job_id = ANY (${ids}) GROUP BY queue`
          assert.deepStrictEqual(
            rows.map((r) => [r.queue, r.n]),
            [[keeps, 3]]
          )
        })
      )
  )
})
