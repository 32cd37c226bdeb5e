/**
 * Reclamation never stops (migration 0021, docs/adr/0018-reclamation-liveness.md): whatever one
 * queue does (paused with jobs, served by no worker, a backlog draining slowly), the ring keeps
 * rotating and pruning, partitions stay bounded, and every held-up job is still there and runs in
 * lane order afterwards; and prune gets its lock against readers that never all let go at once
 * and against a session idle in transaction.
 */
import { assert, describe, it } from "@effect/vitest"
import { Deferred, Effect, Fiber } from "effect"
import { SqlClient } from "effect/sql"
import { type PruneOutcome, QueueStorage } from "../src/QueueStorage.ts"
import { claimOf, completeAll, eagerStorage, fresh, keepAll, withEagerDatabase } from "./pgFixtures.ts"

const job = (queue: string, n: number) => ({ kind: "live", queue, args: { n } })

/** Rotate, then prune until a prune answers anything but `Pruned`; the outcomes. */
const tick = Effect.gen(function* () {
  const storage = yield* QueueStorage
  const rotated = yield* storage.rotate
  const outcomes: Array<PruneOutcome> = []
  for (let i = 0; i < 16; i++) {
    const outcome = yield* storage.prune(keepAll)
    outcomes.push(outcome)
    if (outcome._tag !== "Pruned") break
  }
  return { rotated, outcomes }
})

/** The most rows any one child of `ready` holds. */
const largestReadyChild = Effect.gen(function* () {
  const sql = yield* SqlClient.SqlClient
  const [row] = yield* sql<{ n: number }>`
    SELECT coalesce(max(n), 0)::int AS n FROM (SELECT count(*) AS n FROM awa.ready GROUP BY slot) s`
  return row!.n
})

/** Claims `queue` dry (bringing parked rows back first), completing each batch; the job ids in claim order. */
const drain = (queue: string) =>
  Effect.gen(function* () {
    const storage = yield* QueueStorage
    const order: Array<bigint> = []
    for (let idle = 0; idle < 3; ) {
      yield* storage.promoteDue(100)
      const batch = yield* storage.claim(claimOf(queue, 100))
      if (batch.length === 0) {
        idle++
        continue
      }
      idle = 0
      order.push(...batch.map((c) => c.jobId))
      yield* completeAll(batch)
    }
    return order
  })

const ringTable = /^(ready|ready_tombstones|claims|claim_marks|claim_spans|closures|terminal|history)_\d+$/

describe("reclamation liveness", () => {
  // Property 1, scaled down (the full size is `bench/src/liveness.ts`). Carry bound 20 rows per
  // prune (10 per lane), unpark batch 10: a ready child holds at most one iteration of the busy
  // queue (20) + the backlog's share of it (the backlog is enqueued before the loop) + 20 carried
  // + one refill (10) = 50 rows.
  it.live(
    "a paused queue, an unserved queue and a slow backlog do not stop rotation or prune; afterwards every held-up job runs once, in lane order",
    () =>
      withEagerDatabase({ pruneCarryRows: 20 }, () =>
        Effect.gen(function* () {
          const storage = yield* QueueStorage
          const sql = yield* SqlClient.SqlClient
          const before = new Map(
            (yield* sql<{ relname: string; upd: bigint; del: bigint }>`
              SELECT relname, n_tup_upd AS upd, n_tup_del AS del FROM pg_stat_user_tables WHERE schemaname = 'awa'`).map(
              (r) => [r.relname, r]
            )
          )
          const paused = fresh("paused")
          const unserved = fresh("unserved")
          const backlog = fresh("backlog")
          const busy = fresh("busy")
          yield* storage.pauseQueue(paused)
          const ids = {
            paused: (yield* storage.enqueueMany(Array.from({ length: 60 }, (_, n) => job(paused, n)))).map(
              (x) => x.id
            ),
            unserved: (yield* storage.enqueueMany(
              Array.from({ length: 60 }, (_, n) => job(unserved, n))
            )).map((x) => x.id),
            backlog: (yield* storage.enqueueMany(Array.from({ length: 300 }, (_, n) => job(backlog, n)))).map(
              (x) => x.id
            )
          }
          const backlogOrder: Array<bigint> = []
          let pruned = 0
          let rotations = 0
          let largest = 0
          const busyIds: Array<bigint> = []
          for (let i = 0; i < 40; i++) {
            busyIds.push(
              ...(yield* storage.enqueueMany(Array.from({ length: 20 }, (_, n) => job(busy, n)))).map(
                (x) => x.id
              )
            )
            yield* completeAll(yield* storage.claim(claimOf(busy, 100)))
            // the backlog drains slowly: 3 jobs per rotation, far slower than 16 rotations
            yield* storage.promoteDue(10)
            const slow = yield* storage.claim(claimOf(backlog, 3))
            backlogOrder.push(...slow.map((c) => c.jobId))
            yield* completeAll(slow)
            const { rotated, outcomes } = yield* tick
            if (rotated === "Rotated") rotations++
            pruned += outcomes.filter((o) => o._tag === "Pruned").length
            largest = Math.max(largest, yield* largestReadyChild)
          }
          // the ring kept moving: every iteration rotated, and prune kept up with it
          assert.strictEqual(rotations, 40, "rotations")
          assert.isAtLeast(pruned, 40 - 15, "prunes")
          assert.isAtMost(largest, 50, "largest ready partition")
          // history received the busy queue's jobs (those of pruned slots)
          const [hist] = yield* sql<{ n: number }>`
            SELECT count(*)::int AS n FROM awa.history WHERE queue = ${busy} AND state = 'completed'`
          assert.isAtLeast(hist!.n, 20 * 20, "busy jobs in history")
          // every held-up job is still there, available
          for (const q of [paused, unserved]) {
            const [left] = yield* sql<{ n: number }>`
              SELECT count(*)::int AS n FROM awa.jobs WHERE queue = ${q} AND state = 'available'`
            assert.strictEqual(left!.n, 60, `${q} available`)
          }
          // some of them were parked (the bound held by parking, not by luck)
          const [parked] = yield* sql<{ n: number }>`SELECT count(*)::int AS n FROM awa.parked`
          assert.isAbove(parked!.n, 0, "parked rows")
          // ... and run once, in lane order, once served
          yield* storage.resumeQueue(paused)
          assert.deepStrictEqual(yield* drain(paused), ids.paused, "paused queue order")
          assert.deepStrictEqual(yield* drain(unserved), ids.unserved, "unserved queue order")
          backlogOrder.push(...(yield* drain(backlog)))
          assert.deepStrictEqual(backlogOrder, ids.backlog, "backlog order")
          // the pinned-horizon property still holds: no update or delete on a ring child (the pool's
          // other connections flush their statistics within a second of going idle)
          yield* Effect.sleep("1500 millis")
          const after = yield* sql<{ relname: string; upd: bigint; del: bigint }>`
            SELECT relname, n_tup_upd AS upd, n_tup_del AS del FROM pg_stat_user_tables WHERE schemaname = 'awa'`
          for (const r of after.filter((r) => ringTable.test(r.relname))) {
            const b = before.get(r.relname)
            assert.strictEqual(Number(r.upd - (b?.upd ?? 0n)), 0, `${r.relname} updates`)
            assert.strictEqual(Number(r.del - (b?.del ?? 0n)), 0, `${r.relname} deletes`)
          }
        })
      ),
    240_000
  )
})

/** A sealed slot holding `n` completed jobs of a fresh queue, next in line for prune. */
const sealedSlot = (n: number) =>
  Effect.gen(function* () {
    const storage = yield* QueueStorage
    const q = fresh("sealed")
    yield* storage.enqueueMany(Array.from({ length: n }, (_, i) => job(q, i)))
    yield* completeAll(yield* storage.claim(claimOf(q, n)))
    assert.strictEqual(yield* storage.rotate, "Rotated")
  })

/** Waits until some other session is in `state` running a query that matches `like`. */
const sessionIn = (state: string, like: string) =>
  Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    for (;;) {
      const [row] = yield* sql<{ n: number }>`
        SELECT count(*)::int AS n FROM pg_stat_activity
        WHERE state = ${state} AND query LIKE ${like} AND pid <> pg_backend_pid()`
      if (row!.n > 0) return
      yield* Effect.sleep("20 millis")
    }
  })

describe("prune cannot starve", () => {
  // Property 2a: readers that overlap (each a 1.5 s SELECT over the whole `jobs` view, two of them
  // half a period apart) never all let go of the slot at once, so NOWAIT never gets the lock; a
  // queued request gets it as soon as the readers it found have finished (≤ 1.5 s), because the
  // readers that come after it queue behind it (and stall that long at most).
  it.live(
    "long readers that overlap starve the NOWAIT lock, not a queued one",
    () =>
      withEagerDatabase({}, (url) =>
        Effect.gen(function* () {
          const storage = yield* QueueStorage
          yield* sealedSlot(20)
          const stop = yield* Deferred.make<void>()
          const reader = (delay: "0 millis" | "750 millis") =>
            Effect.gen(function* () {
              const c = yield* SqlClient.SqlClient
              yield* Effect.sleep(delay)
              while (!(yield* Deferred.isDone(stop)))
                yield* c.unsafe("SELECT count(*) FROM awa.jobs j CROSS JOIN pg_sleep(1.5) /* long reader */")
            }).pipe(
              Effect.provide(eagerStorage(url, 1), { local: true }),
              Effect.forkChild({ startImmediately: true })
            )
          const a = yield* reader("0 millis")
          yield* sessionIn("active", "%long reader%")
          const b = yield* reader("750 millis")
          yield* Effect.sleep("900 millis")
          for (let i = 0; i < 5; i++) {
            assert.deepStrictEqual(
              yield* storage.prune(keepAll),
              { _tag: "Blocked", reason: "lock" },
              `NOWAIT ${i}`
            )
            yield* Effect.sleep("150 millis")
          }
          const started = performance.now()
          const forced = yield* storage.prune({ ...keepAll, forceLockTimeoutMs: 2000 })
          const waited = performance.now() - started
          assert.strictEqual(forced._tag, "Pruned", `forced prune after ${waited.toFixed(0)} ms`)
          yield* Deferred.succeed(stop, undefined)
          yield* Fiber.join(a)
          yield* Fiber.join(b)
        })
      ),
    60_000
  )

  // Property 2c (0053): rescue's sweep reads claim_spans in one statement and claims in the next.
  // Between the two it holds claim_spans children; a forced prune that got the claims parent
  // first would make the sweep's next statement wait for it while it waits for those children (to
  // its force timeout: Blocked:lock). A forced prune takes claim_spans before claims, so it waits
  // for the sweep's transaction, which goes on, and then prunes. Seen to fail with the parents in
  // 0052's order (claim_marks, claims): Blocked:lock after the force timeout.
  it.live(
    "a forced prune waits for a sweep between its span and claims reads, and prunes after it",
    () =>
      withEagerDatabase({}, (url) =>
        Effect.gen(function* () {
          const storage = yield* QueueStorage
          const sql = yield* SqlClient.SqlClient
          yield* sealedSlot(20)
          const spansRead = yield* Deferred.make<void>()
          const goOn = yield* Deferred.make<void>()
          const sweep = yield* Effect.gen(function* () {
            const c = yield* SqlClient.SqlClient
            yield* c.withTransaction(
              Effect.gen(function* () {
                yield* c.unsafe("SELECT count(*) FROM awa.claim_spans /* sweep */")
                yield* Deferred.succeed(spansRead, undefined)
                yield* Deferred.await(goOn)
                yield* c.unsafe("SELECT count(*) FROM awa.claims /* sweep */")
              })
            )
          }).pipe(
            Effect.provide(eagerStorage(url, 1), { local: true }),
            Effect.forkChild({ startImmediately: true })
          )
          yield* Deferred.await(spansRead)
          const prune = yield* Effect.forkChild(storage.prune({ ...keepAll, forceLockTimeoutMs: 5000 }), {
            startImmediately: true
          })
          // until the prune holds the claim_marks parent (its first lock in either order)
          for (;;) {
            const [row] = yield* sql<{ n: number }>`
              SELECT count(*)::int AS n FROM pg_locks
              WHERE relation = 'awa.claim_marks'::regclass AND mode = 'AccessExclusiveLock' AND granted`
            if (row!.n > 0) break
            yield* Effect.sleep("5 millis")
          }
          yield* Deferred.succeed(goOn, undefined)
          yield* Fiber.join(sweep)
          assert.strictEqual((yield* Fiber.join(prune))._tag, "Pruned")
        })
      ),
    60_000
  )

  // Property 2b: a session idle in transaction after reading `jobs` holds every ring child until it
  // ends. A forced prune that still cannot lock the slot ends such a session once it has been idle
  // longer than pruneEndIdleBlockersAfterMs (300 ms here, 60 s by default); the next one prunes.
  it.live(
    "a session idle in transaction that read jobs is ended by a forced prune, which then prunes",
    () =>
      withEagerDatabase({ pruneEndIdleBlockersAfterMs: 300 }, (url) =>
        Effect.gen(function* () {
          const storage = yield* QueueStorage
          const sql = yield* SqlClient.SqlClient
          yield* sealedSlot(20)
          const read = yield* Deferred.make<void>()
          const idle = yield* Effect.gen(function* () {
            const c = yield* SqlClient.SqlClient
            yield* c.withTransaction(
              Effect.andThen(
                c.unsafe("SELECT count(*) FROM awa.jobs /* idle reader */"),
                Effect.andThen(Deferred.succeed(read, undefined), Effect.sleep("60 seconds"))
              )
            )
          }).pipe(
            Effect.provide(eagerStorage(url, 1), { local: true }),
            Effect.forkChild({ startImmediately: true })
          )
          yield* Deferred.await(read)
          yield* sessionIn("idle in transaction", "%idle reader%")
          assert.deepStrictEqual(yield* storage.prune(keepAll), { _tag: "Blocked", reason: "lock" })
          // idle for longer than the bound
          for (;;) {
            const [row] = yield* sql<{ n: number }>`
            SELECT count(*)::int AS n FROM pg_stat_activity
            WHERE state = 'idle in transaction' AND query LIKE '%idle reader%' AND state_change < now() - interval '400 ms'`
            if (row!.n > 0) break
            yield* Effect.sleep("50 millis")
          }
          let outcome = yield* storage.prune({ ...keepAll, forceLockTimeoutMs: 200 })
          assert.deepStrictEqual(
            outcome,
            { _tag: "Blocked", reason: "lock" },
            "the first forced prune finds the session"
          )
          // the session is ended; its locks go with its backend
          for (;;) {
            const [row] = yield* sql<{ n: number }>`
            SELECT count(*)::int AS n FROM pg_stat_activity WHERE state LIKE 'idle in transaction%' AND query LIKE '%idle reader%'`
            if (row!.n === 0) break
            yield* Effect.sleep("50 millis")
          }
          for (let i = 0; i < 20 && outcome._tag !== "Pruned"; i++) {
            outcome = yield* storage.prune({ ...keepAll, forceLockTimeoutMs: 200 })
            if (outcome._tag !== "Pruned") yield* Effect.sleep("50 millis")
          }
          assert.strictEqual(outcome._tag, "Pruned")
          // its owner finds out at its next statement
          yield* Fiber.interrupt(idle)
        })
      ),
    60_000
  )
})
