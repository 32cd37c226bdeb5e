/**
 * The paths around reclamation liveness (migration 0021, docs/adr/0018-reclamation-liveness.md):
 * unique keys released after the truncate rather than under its exclusive lock, cancel of a
 * parked job, and promotion past a lane whose producer holds its enqueue lock.
 */
import { assert, describe, it } from "@effect/vitest"
import { Deferred, Effect, Fiber } from "effect"
import { SqlClient } from "effect/sql"
import { QueueStorage } from "../src/QueueStorage.ts"
import {
  claimOf,
  completeAll,
  eagerStorage,
  fresh,
  holdOpenUntil,
  keepNothing,
  withEagerDatabase
} from "./pgFixtures.ts"

const job = (queue: string, n: number) => ({ kind: "paths", queue, args: { n } })

describe("reclamation liveness: paths", () => {
  // Review M6: release_keys_of ran under prune's exclusive lock, so anything that held it up (here
  // a session holding the key's row) held every reader of the ring behind the prune.
  it.live("unique keys are released after the truncate commits, not under the exclusive lock", () =>
    withEagerDatabase({}, (url) =>
      Effect.gen(function* () {
        const storage = yield* QueueStorage
        const sql = yield* SqlClient.SqlClient
        const q = fresh("keys")
        const unique = { byArgs: true }
        yield* storage.enqueueMany([{ ...job(q, 1), unique }])
        yield* completeAll(yield* storage.claim(claimOf(q, 1)))
        assert.strictEqual(yield* storage.rotate, "Rotated")
        const release = yield* Deferred.make<void>()
        const holder = yield* holdOpenUntil(url, "SELECT 1 FROM awa.unique_claims FOR UPDATE", release)
        const pruning = yield* Effect.flatMap(QueueStorage, (s) => s.prune(keepNothing)).pipe(
          Effect.provide(eagerStorage(url, 1), { local: true }),
          Effect.forkChild({ startImmediately: true })
        )
        // the key release is waiting for the row
        for (;;) {
          const [row] = yield* sql<{ n: number }>`
            SELECT count(*)::int AS n FROM pg_stat_activity
            WHERE wait_event_type = 'Lock' AND datname = current_database() AND pid <> pg_backend_pid()`
          if (row!.n > 0) break
          yield* Effect.sleep("20 millis")
        }
        // meanwhile a reader of the ring is not held up: the slot was already truncated
        const read = yield* Effect.gen(function* () {
          const c = yield* SqlClient.SqlClient
          return yield* c.withTransaction(
            Effect.andThen(
              c`SET LOCAL lock_timeout = '500ms'`,
              c<{ n: number }>`SELECT count(*)::int AS n FROM awa.claims`
            )
          )
        }).pipe(Effect.provide(eagerStorage(url, 1), { local: true }), Effect.result)
        assert.strictEqual(read._tag, "Success", "a ring read during the key release")
        yield* Deferred.succeed(release, undefined)
        yield* Fiber.join(holder)
        assert.strictEqual((yield* Fiber.join(pruning))._tag, "Pruned")
        // the key is free again
        const [again] = yield* storage.enqueueMany([{ ...job(q, 1), unique }])
        assert.isDefined(again)
        const [pending] = yield* sql<{ n: number }>`SELECT count(*)::int AS n FROM awa.pending_key_releases`
        assert.strictEqual(pending!.n, 0)
      })
    )
  )

  it.live("a parked job can be cancelled; the rest of its lane runs in order once resumed", () =>
    withEagerDatabase({ pruneCarryRows: 4 }, () =>
      Effect.gen(function* () {
        const storage = yield* QueueStorage
        const sql = yield* SqlClient.SqlClient
        const q = fresh("parked")
        yield* storage.pauseQueue(q)
        const ids = (yield* storage.enqueueMany(Array.from({ length: 10 }, (_, n) => job(q, n)))).map(
          (x) => x.id
        )
        assert.strictEqual(yield* storage.rotate, "Rotated")
        assert.strictEqual((yield* storage.prune(keepNothing))._tag, "Pruned")
        const [parked] = yield* sql<{
          n: number
        }>`SELECT count(*)::int AS n FROM awa.parked WHERE queue = ${q}`
        assert.strictEqual(parked!.n, 10, "a paused queue's residue is parked")
        assert.strictEqual((yield* storage.getJob(ids[3]!)).state, "available")
        assert.strictEqual((yield* storage.cancelJob(ids[3]!, "no longer wanted")).state, "cancelled")
        yield* storage.resumeQueue(q)
        const order: Array<bigint> = []
        for (let idle = 0; idle < 3; ) {
          yield* storage.promoteDue(4)
          const batch = yield* storage.claim(claimOf(q, 3))
          if (batch.length === 0) idle++
          else idle = 0
          order.push(...batch.map((c) => c.jobId))
          yield* completeAll(batch)
        }
        assert.deepStrictEqual(
          order,
          ids.filter((_, i) => i !== 3)
        )
      })
    )
  )

  // Review m5: promote took its lanes from the first `limit` due rows only; when all of them
  // belonged to a lane whose producer held the enqueue lock, nothing was promoted at all.
  it.live("promotion is not held up by a busy lane's earlier due rows", () =>
    withEagerDatabase({}, (url) =>
      Effect.gen(function* () {
        const storage = yield* QueueStorage
        const sql = yield* SqlClient.SqlClient
        const busy = fresh("busy-lane")
        const other = fresh("other-lane")
        const later = new Date(Date.now() + 3_600_000)
        yield* storage.enqueueMany(Array.from({ length: 10 }, (_, n) => ({ ...job(busy, n), runAt: later })))
        const [mine] = yield* storage.enqueueMany([{ ...job(other, 0), runAt: later }])
        // due now, the busy lane's rows first (tests may backdate timestamps)
        yield* sql`UPDATE awa.deferred SET run_at = now() - interval '2 minutes' WHERE queue = ${busy}`
        yield* sql`UPDATE awa.deferred SET run_at = now() - interval '1 minute' WHERE queue = ${other}`
        const [lane] = yield* sql<{
          priority: number
        }>`SELECT DISTINCT priority FROM awa.deferred WHERE queue = ${busy}`
        const release = yield* Deferred.make<void>()
        const producer = yield* holdOpenUntil(
          url,
          `SELECT pg_advisory_xact_lock(awa.lock_ns('enqueue'), awa.lane_key('${busy}', ${lane!.priority}, 0))`,
          release
        )
        assert.isAtLeast(yield* storage.promoteDue(5), 1)
        assert.strictEqual((yield* storage.getJob(mine!.id)).state, "available")
        yield* Deferred.succeed(release, undefined)
        yield* Fiber.join(producer)
      })
    )
  )

  // Park ahead (0021) leaves a "moved" tombstone in the old slot until that slot is truncated, and
  // tombstones match by lane position: a parked row brought back before then would be skipped.
  it.live("a row parked ahead stays parked until its old slot is truncated, then runs in order", () =>
    withEagerDatabase({ pruneCarryRows: 4 }, (url) =>
      Effect.gen(function* () {
        const storage = yield* QueueStorage
        const sql = yield* SqlClient.SqlClient
        const q = fresh("ahead")
        const ids = (yield* storage.enqueueMany(Array.from({ length: 20 }, (_, n) => job(q, n)))).map(
          (x) => x.id
        )
        assert.strictEqual(yield* storage.rotate, "Rotated")
        const parkedRows = Effect.map(
          sql<{ n: number }>`SELECT count(*)::int AS n FROM awa.parked WHERE queue = ${q}`,
          (rows) => rows[0]!.n
        )
        // a reader of the ring keeps the exclusive lock out: the residue is parked ahead, committed
        const release = yield* Deferred.make<void>()
        const reader = yield* holdOpenUntil(url, "SELECT count(*) FROM awa.claims", release)
        assert.deepStrictEqual(yield* storage.prune(keepNothing), { _tag: "Blocked", reason: "lock" })
        const parked = yield* parkedRows
        assert.isAbove(parked, 0, "parked ahead")
        // the carried head is short, but the parked rows' tombstones are still in the ring
        yield* storage.promoteDue(10)
        assert.strictEqual(yield* parkedRows, parked, "nothing brought back while its tombstone is there")
        yield* Deferred.succeed(release, undefined)
        yield* Fiber.join(reader)
        assert.strictEqual((yield* storage.prune(keepNothing))._tag, "Pruned")
        const order: Array<bigint> = []
        for (let idle = 0; idle < 3; ) {
          yield* storage.promoteDue(10)
          const batch = yield* storage.claim(claimOf(q, 3))
          if (batch.length === 0) idle++
          else idle = 0
          order.push(...batch.map((c) => c.jobId))
          yield* completeAll(batch)
        }
        assert.deepStrictEqual(order, ids)
      })
    )
  )
})
