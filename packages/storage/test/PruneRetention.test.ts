/**
 * A queue's own retention (queue_meta.completed_retention) overrides the prune's argument when
 * the queue ring's slot is judged (0039 joins queue_meta once instead of calling retention() per
 * row): a queue that keeps nothing loses its completed jobs at prune, its neighbour keeps them.
 * A slot of at least 1,000 terminal rows is judged and copied in one statement (0048), the
 * others through an array: both branches are run here. With no queue's own retention, that
 * statement filters the kept rows before their join (0060): the last two tests run it, with some
 * rows kept and some dropped, and with every row dropped.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { SqlClient } from "effect/sql"
import { QueueStorage, type RetentionParams } from "../src/QueueStorage.ts"
import { claimOf, completeAll, fresh, keepAll, keepNothing, withEagerDatabase } from "./pgFixtures.ts"

const day = 86_400_000

/**
 * Seals the current queue slot, prunes it (the layer calls again after 'Copied'), and reads what
 * the prune recorded: its outcomes, the slot's roll-up, and the rows a copy ahead judged (none
 * when it copied nothing ahead).
 */
const pruneSealed = (retention: RetentionParams) =>
  Effect.gen(function* () {
    const storage = yield* QueueStorage
    const sql = yield* SqlClient.SqlClient
    const [sealed] = yield* sql<{ generation: string }>`
      SELECT generation::text AS generation FROM awa.ring_current('queue')`
    yield* storage.rotateWhenDue({ minRows: 1, maxAgeMs: 0 })
    const outcomes: Array<string> = []
    for (let i = 0; i < 5 && outcomes.at(-1) !== "Pruned"; i++)
      outcomes.push((yield* storage.prune({ ...retention, carryAfterMs: 0 }))._tag)
    const [rollup] = yield* sql<{ rollup: Record<string, number> }>`
      SELECT rollup FROM awa.ring_prunes WHERE ring = 'queue' AND generation = ${sealed!.generation}::bigint`
    const [copy] = yield* sql<{ rows: number }>`
      SELECT terminal_rows::int AS rows FROM awa.history_copies WHERE generation = ${sealed!.generation}::bigint`
    return { outcomes, rollup: rollup?.rollup, copiedAhead: copy?.rows }
  })

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

  it.live(
    "a large slot, judged and copied in one statement, keeps per-queue retention, copies once and releases the keys it drops",
    () =>
      withEagerDatabase({}, () =>
        Effect.gen(function* () {
          const storage = yield* QueueStorage
          const sql = yield* SqlClient.SqlClient
          const [keeps, drops] = [fresh("big-keep"), fresh("big-drop")]
          yield* sql`INSERT INTO awa.queue_meta (queue, completed_retention) VALUES (${drops}, interval '0')`
          // 600 + 600 terminal rows in one slot: past 0048's 1,000, with fewer than 1,000 kept
          const per = 600
          const job = (queue: string, n: number) => ({
            kind: queue,
            queue,
            args: { n },
            unique: { byArgs: true }
          })
          for (const q of [keeps, drops]) {
            yield* storage.enqueueMany(Array.from({ length: per }, (_, n) => job(q, n)))
            yield* completeAll(yield* storage.claim(claimOf(q, per)))
          }
          // a completed job still holds its unique key until prune drops it
          const again = storage.enqueueMany([job(drops, 0)])
          assert.strictEqual((yield* Effect.flip(again))._tag, "UniqueConflict")
          const { outcomes, rollup } = yield* pruneSealed(keepAll)
          assert.strictEqual(outcomes.at(-1), "Pruned")
          const rows = yield* sql<{ queue: string; n: number; distinct: number }>`
            SELECT queue, count(*)::int AS n, count(DISTINCT job_id)::int AS distinct
            FROM awa.history WHERE queue IN (${keeps}, ${drops}) GROUP BY queue`
          assert.deepStrictEqual(
            rows.map((r) => [r.queue, r.n, r.distinct]),
            [[keeps, per, per]],
            "the kept queue's rows once each, none of the other's"
          )
          // the copy kept the payload of the narrow terminal rows (from their ready rows)
          const [payload] = yield* sql<{ n: number }>`
            SELECT count(*)::int AS n FROM awa.history WHERE queue = ${keeps} AND kind = ${keeps} AND (args->>'n') IS NOT NULL`
          assert.strictEqual(payload!.n, per)
          assert.deepStrictEqual(rollup, { [`${keeps}:completed`]: per, [`${drops}:completed`]: per })
          // the dropped jobs' keys were released: the same job can be enqueued again
          const [enqueued] = yield* again
          assert.strictEqual(enqueued!.queue, drops)
        })
      )
  )

  // 0060's statement: no queue_meta retention anywhere in the databases of the next two tests
  // a key held while the job is completed or failed, released when prune drops the row
  const keyed = (queue: string, n: number) => ({
    kind: queue,
    queue,
    args: { n },
    unique: { byArgs: true, states: ["available", "running", "completed", "failed"] as const }
  })

  it.live(
    "with no queue's own retention, a large slot copies its kept rows once, counts the dropped ones and releases their keys",
    () =>
      withEagerDatabase({}, () =>
        Effect.gen(function* () {
          const storage = yield* QueueStorage
          const sql = yield* SqlClient.SqlClient
          const [done, mixed] = [fresh("fast-done"), fresh("fast-mixed")]
          // 600 completed in one queue; 300 completed and 200 failed in the other: 1,100 terminal rows
          yield* storage.enqueueMany(Array.from({ length: 600 }, (_, n) => keyed(done, n)))
          yield* completeAll(yield* storage.claim(claimOf(done, 600)))
          yield* storage.enqueueMany(Array.from({ length: 500 }, (_, n) => keyed(mixed, n)))
          const claimed = yield* storage.claim(claimOf(mixed, 500))
          yield* storage.finalizeMany(
            claimed.map((c, i) => ({
              jobId: c.jobId,
              runLease: c.runLease,
              outcome: i < 300 ? { _tag: "Complete" as const } : { _tag: "Fail" as const, error: "boom" }
            }))
          )
          // completed kept (a day), failed dropped (0)
          const { outcomes, rollup, copiedAhead } = yield* pruneSealed({
            completedMs: day,
            failedMs: 0,
            cancelledMs: 0
          })
          assert.deepStrictEqual(outcomes, ["Pruned"])
          assert.strictEqual(copiedAhead, 1100, "copied ahead in one statement, every terminal row judged")
          const rows = yield* sql<{
            queue: string
            state: string
            n: number
            distinct: number
            payload: number
          }>`
            SELECT queue, state, count(*)::int AS n, count(DISTINCT job_id)::int AS distinct,
                   count(*) FILTER (WHERE kind = queue AND (args->>'n') IS NOT NULL)::int AS payload
            FROM awa.history WHERE queue IN (${done}, ${mixed}) GROUP BY queue, state ORDER BY queue, state`
          assert.deepStrictEqual(
            rows.map((r) => [r.queue, r.state, r.n, r.distinct, r.payload]),
            [
              [done, "completed", 600, 600, 600],
              [mixed, "completed", 300, 300, 300]
            ],
            "the completed rows once each, with their payload; no failed row"
          )
          assert.deepStrictEqual(rollup, {
            [`${done}:completed`]: 600,
            [`${mixed}:completed`]: 300,
            [`${mixed}:failed`]: 200
          })
          // a failed job's key was released with its row; a completed job still holds its key
          const [again] = yield* storage.enqueueMany([keyed(mixed, 499)])
          assert.strictEqual(again!.queue, mixed)
          const held = yield* Effect.flip(storage.enqueueMany([keyed(mixed, 0)]))
          assert.strictEqual(held._tag, "UniqueConflict")
        })
      )
  )

  it.live(
    "with no queue's own retention and nothing kept, a large slot is pruned at once and every key released",
    () =>
      withEagerDatabase({}, () =>
        Effect.gen(function* () {
          const storage = yield* QueueStorage
          const sql = yield* SqlClient.SqlClient
          const lean = fresh("fast-lean")
          yield* storage.enqueueMany(Array.from({ length: 1200 }, (_, n) => keyed(lean, n)))
          yield* completeAll(yield* storage.claim(claimOf(lean, 1200)))
          const { outcomes, rollup, copiedAhead } = yield* pruneSealed(keepNothing)
          assert.deepStrictEqual(outcomes, ["Pruned"])
          assert.strictEqual(copiedAhead, undefined, "nothing to copy ahead: judged and pruned in one call")
          assert.deepStrictEqual(rollup, { [`${lean}:completed`]: 1200 })
          const [stored] = yield* sql<{
            n: number
          }>`SELECT count(*)::int AS n FROM awa.history WHERE queue = ${lean}`
          assert.strictEqual(stored!.n, 0)
          const again = yield* storage.enqueueMany([keyed(lean, 0), keyed(lean, 1199)])
          assert.strictEqual(again.length, 2, "the keys were released")
        })
      )
  )
})
