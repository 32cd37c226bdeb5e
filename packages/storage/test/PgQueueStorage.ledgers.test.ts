/**
 * Ledger retention (migration 0017, docs/adr/0013-ledger-retention.md): `trimLedgers` keeps
 * `ring_rotations`, `ring_prunes` and `history_copies` bounded without changing any answer their
 * readers give, and the maintenance policy can be passed per call.
 */
import { TestDatabase } from "@awa/testing"
import { PgClient } from "@effect/sql-pg"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Fiber, Layer, Redacted } from "effect"
import { SqlClient } from "effect/sql"
import { type PgQueueStorageOptions, layer as pgLayer } from "../src/PgQueueStorage.ts"
import { type PruneOutcome, QueueStorage } from "../src/QueueStorage.ts"
import { claimOf, completeAll, fresh, keepAll, keepNothing } from "./pgFixtures.ts"

const queueSlots = 16
const historySlots = 32
const job = (queue: string, n = 0) => ({ kind: "ledger", queue, args: { n } })

/** Storage on a fresh database, by default rotating whenever the slot has rows and carrying at once. */
const withDatabase = <A, E>(
  body: (url: string) => Effect.Effect<A, E, QueueStorage | SqlClient.SqlClient>,
  maxConnections = 3,
  options: PgQueueStorageOptions = { rotateMinRows: 1, pruneCarryAfterMs: 0 }
) =>
  Effect.flatMap(TestDatabase.acquire(), ({ url }) =>
    body(url).pipe(
      Effect.provide(
        pgLayer(options).pipe(Layer.provideMerge(PgClient.layer({ url: Redacted.make(url), maxConnections })))
      )
    )
  )

/**
 * One turn of the rings: `n` jobs of `q` completed (some cancelled while unclaimed), the queue ring
 * rotated and pruned (terminal rows kept for history), the history ring rotated and pruned.
 * Returns how many queue-ring prunes happened.
 */
const turn = (q: string, n: number) =>
  Effect.gen(function* () {
    const storage = yield* QueueStorage
    const ids = yield* storage.enqueueMany(Array.from({ length: n }, (_, i) => job(q, i)))
    yield* storage.cancelJob(ids[0]!.id, "ledger test")
    for (let b = yield* storage.claim(claimOf(q, n)); b.length > 0; b = yield* storage.claim(claimOf(q, n)))
      yield* completeAll(b)
    yield* storage.rotate
    let pruned = 0
    while ((yield* storage.prune(keepAll))._tag === "Pruned") pruned++
    yield* storage.rotateHistory(0)
    yield* storage.pruneHistory(keepNothing)
    return pruned
  })

/** Every answer a reader of the ledgers can give. */
const readers = Effect.gen(function* () {
  const storage = yield* QueueStorage
  const sql = yield* SqlClient.SqlClient
  const status = yield* storage.status
  const [totals] = yield* sql<{ queue: unknown; history: unknown }>`
    SELECT to_jsonb(awa.ledger_totals('queue')) AS queue, to_jsonb(awa.ledger_totals('history')) AS history`
  // "is G pruned" for every generation either ring ever had
  const pruned = yield* sql<{ ring: string; generation: string; pruned: boolean }>`
    SELECT r.ring, g::text AS generation, awa.ring_pruned(r.ring, g) AS pruned
    FROM (VALUES ('queue'), ('history')) r(ring), LATERAL awa.ring_current(r.ring) c,
         generate_series(0, c.generation) g
    ORDER BY r.ring, g`
  const current = yield* sql<{ ring: string; generation: string; slot: number }>`
    SELECT r.ring, c.generation::text AS generation, c.slot
    FROM (VALUES ('queue'), ('history')) r(ring), LATERAL awa.ring_current(r.ring) c ORDER BY 1`
  return {
    status,
    totals,
    pruned,
    current,
    counts: yield* storage.countByQueueState,
    jobs: (yield* storage.listJobs({ limit: 1000 })).map((j) => [j.id, j.state])
  }
})

/** Rows per ledger and ring. */
const ledgerRows = Effect.flatMap(
  SqlClient.SqlClient,
  (sql) => sql<{ ledger: string; ring: string; n: number }>`
    SELECT 'rotations' AS ledger, ring, count(*)::int AS n FROM awa.ring_rotations GROUP BY ring
    UNION ALL SELECT 'prunes', ring, count(*)::int FROM awa.ring_prunes GROUP BY ring
    UNION ALL SELECT 'copies', 'queue', count(*)::int FROM awa.history_copies
    ORDER BY 1, 2`
)
const rowsOf = (
  rows: ReadonlyArray<{ ledger: string; ring: string; n: number }>,
  ledger: string,
  ring: string
) => rows.find((r) => r.ledger === ledger && r.ring === ring)?.n ?? 0

describe("ledger retention", () => {
  it.live(
    "many rotations and prunes, then a trim: the ledgers are bounded and every reader answers as before",
    () =>
      withDatabase(() =>
        Effect.gen(function* () {
          const storage = yield* QueueStorage
          const sql = yield* SqlClient.SqlClient
          const q = fresh("trim")
          // two slots of ≥ 1,000 kept rows are copied ahead (history_copies rows), then many small turns
          let prunes = 0
          for (let i = 0; i < 2; i++) prunes += yield* turn(q, 1100)
          for (let i = 0; i < 70; i++) prunes += yield* turn(q, 3)
          // a sealed slot left alone (an open attempt younger than the carry threshold; since
          // migration 0020 an unclaimed job no longer holds a slot): oldestUnpruned is not null
          const stuck = fresh("stuck")
          yield* storage.enqueueMany([job(stuck)])
          const stuckClaim = yield* storage.claim(claimOf(stuck, 1))
          assert.strictEqual(yield* storage.rotate, "Rotated")
          assert.deepStrictEqual(yield* storage.prune({ ...keepAll, carryAfterMs: 3_600_000 }), {
            _tag: "Blocked",
            reason: "young_attempts"
          })

          const before = yield* readers
          const rowsBefore = yield* ledgerRows
          assert.isNotNull(before.status.oldestUnpruned)
          assert.isAbove(rowsOf(rowsBefore, "rotations", "queue"), 70)
          assert.strictEqual(rowsOf(rowsBefore, "copies", "queue"), 2)
          // the windowed oldest-unpruned query answers as the old scan of every rotation did
          const [scan] = yield* sql<{ oldest: string | null }>`
            SELECT (SELECT min(r.generation) FROM awa.ring_rotations r
                    WHERE r.ring = 'queue' AND r.generation < q.generation
                      AND NOT EXISTS (SELECT 1 FROM awa.ring_prunes p WHERE p.ring = 'queue' AND p.generation = r.generation))::text AS oldest
            FROM awa.ring_current('queue') q`
          assert.strictEqual(scan!.oldest, String(before.status.oldestUnpruned))
          // lifetime totals: every queue-ring prune, every job of the two queues counted once
          const totalsBefore = before.totals as { queue: { prunes: number; rollup: Record<string, number> } }
          assert.strictEqual(totalsBefore.queue.prunes, prunes)
          assert.deepStrictEqual(totalsBefore.queue.rollup, {
            [`${q}:completed`]: 2 * 1099 + 70 * 2,
            [`${q}:cancelled`]: 72
          })

          const trim = yield* storage.trimLedgers(5000)
          assert.isAbove(trim.deleted, 0)
          assert.isFalse(trim.more)
          const rowsAfter = yield* ledgerRows
          for (const [ring, n] of [
            ["queue", queueSlots],
            ["history", historySlots]
          ] as const) {
            assert.isAtMost(rowsOf(rowsAfter, "rotations", ring), n, `${ring} rotations`)
            assert.isAtMost(rowsOf(rowsAfter, "prunes", ring), n, `${ring} prunes`)
          }
          assert.strictEqual(rowsOf(rowsAfter, "copies", "queue"), 0)
          assert.deepStrictEqual(yield* readers, before)
          // a second pass right away finds less than a wrap to trim: nothing is written
          assert.deepStrictEqual(yield* storage.trimLedgers(5000), { deleted: 0, more: false })

          // the rings carry on: the stuck slot is freed and pruned, rotation keeps going, and the
          // ledger stays under two wraps whatever the number of turns
          yield* completeAll(stuckClaim)
          for (let i = 0; i < 40; i++) {
            prunes += yield* turn(q, 3)
            yield* storage.trimLedgers(5000)
            const rows = yield* ledgerRows
            assert.isAtMost(rowsOf(rows, "rotations", "queue"), 2 * queueSlots + 1)
            assert.isAtMost(rowsOf(rows, "prunes", "queue"), 2 * queueSlots + 1)
            assert.isAtMost(rowsOf(rows, "rotations", "history"), 2 * historySlots + 1)
          }
          const after = yield* readers
          assert.isNull(after.status.oldestUnpruned)
          const totalsAfter = after.totals as { queue: { prunes: number; rollup: Record<string, number> } }
          assert.strictEqual(totalsAfter.queue.prunes, prunes)
          assert.deepStrictEqual(totalsAfter.queue.rollup, {
            [`${q}:completed`]: 2 * 1099 + 110 * 2,
            [`${q}:cancelled`]: 112,
            [`${stuck}:completed`]: 1
          })
          assert.isTrue(
            after.pruned
              .filter((p) => p.ring === "queue")
              .slice(0, -1)
              .every((p) => p.pruned)
          )
        })
      ),
    300_000
  )

  it.live(
    "trims in batches, and under concurrent rotate and prune never drops a row they need",
    () =>
      withDatabase(
        () =>
          Effect.gen(function* () {
            const storage = yield* QueueStorage
            const q = fresh("race")
            for (let i = 0; i < 60; i++) yield* turn(q, 2)
            // batches: a small batch leaves more behind and says so
            const first = yield* storage.trimLedgers(5)
            assert.isTrue(first.more)
            assert.isAtMost(first.deleted, 5 * 4)
            // a worker turning the rings while another process trims as fast as it can
            let prunes = 0
            const work = yield* Effect.forkChild(
              Effect.gen(function* () {
                for (let i = 0; i < 60; i++) prunes += yield* turn(q, 2)
              })
            )
            const trimmer = yield* Effect.forkChild(
              Effect.forever(Effect.andThen(storage.trimLedgers(5000), Effect.sleep("10 millis")))
            )
            yield* Fiber.join(work)
            yield* Fiber.interrupt(trimmer)
            assert.isAbove(prunes, 30)
            // the rings still turn (rotate found the prune of g + 1 − N; prune its unpruned window)
            let last: PruneOutcome = { _tag: "Noop" }
            for (let i = 0; i < 20; i++) {
              yield* turn(q, 2)
              last = yield* storage.prune(keepAll)
            }
            assert.strictEqual(last._tag, "Noop")
            const status = yield* storage.status
            assert.isNull(status.oldestUnpruned)
            assert.isAbove(Number(status.generation), 120)
            const sql = yield* SqlClient.SqlClient
            // every generation below the newest wrap is still known as pruned, and the totals count
            // every job once
            const [row] = yield* sql<{ all_pruned: boolean; completed: number; prunes: number }>`
              SELECT bool_and(awa.ring_pruned('queue', g)) AS all_pruned,
                     ((awa.ledger_totals('queue')).rollup ->> ${`${q}:completed`})::int AS completed,
                     (awa.ledger_totals('queue')).prunes::int AS prunes
              FROM awa.ring_current('queue') c, generate_series(0, c.generation - 1) g`
            assert.isTrue(row!.all_pruned)
            assert.strictEqual(row!.completed, 140)
            assert.strictEqual(row!.prunes, Number(status.generation))
          }),
        4
      ),
    300_000
  )

  it.live("a rotation policy and carry threshold passed per call win over the storage layer's", () =>
    withDatabase(
      () =>
        Effect.gen(function* () {
          const storage = yield* QueueStorage
          const q = fresh("policy")
          // the template's first incarnation is old: start a new one, and prune the old
          yield* storage.enqueueMany([job(q, 0)])
          assert.strictEqual(yield* storage.rotateWhenDue({ minRows: 1 }), "Rotated")
          yield* completeAll(yield* storage.claim(claimOf(q, 1)))
          assert.strictEqual((yield* storage.prune(keepAll))._tag, "Pruned")
          yield* storage.enqueueMany([job(q, 1), job(q, 2), job(q, 3)])
          // the layer's defaults: 10,000 rows or 10 s
          assert.strictEqual(yield* storage.rotate, "SkippedIdle")
          assert.strictEqual(yield* storage.rotateWhenDue({}), "SkippedIdle")
          assert.strictEqual(yield* storage.rotateWhenDue({ minRows: 4 }), "SkippedIdle")
          assert.strictEqual(yield* storage.rotateWhenDue({ minRows: 3 }), "Rotated")
          // three attempts claimed a moment ago in the sealed slot: the layer (5 s) leaves them
          const claimed = yield* storage.claim(claimOf(q, 3))
          assert.strictEqual(claimed.length, 3)
          assert.deepStrictEqual(yield* storage.prune(keepAll), { _tag: "Blocked", reason: "young_attempts" })
          const pruned = yield* storage.prune({ ...keepAll, carryAfterMs: 0 })
          assert.strictEqual(pruned._tag, "Pruned")
          if (pruned._tag === "Pruned") assert.strictEqual(pruned.carried, 3)
          // by age: the current slot holds the carried rows, 0 ms is old enough
          assert.strictEqual(yield* storage.rotateWhenDue({}), "SkippedIdle")
          assert.strictEqual(yield* storage.rotateWhenDue({ maxAgeMs: 0 }), "Rotated")
          yield* completeAll(claimed)
        }),
      2,
      {}
    )
  )
})
