/**
 * Wake-ups on demand (migration 0051, docs/adr/0038-wake-ups-on-demand.md): an insert sends its
 * queue's wake-up only while a session holds the queue's waiter bucket shared (a worker's signals
 * connection, while a dispatcher of the queue waits), and an insert that sends none holds the
 * bucket exclusively to its commit, so that a worker cannot start waiting in between.
 *
 * No test waits for something not to happen: after the insert commits, a sentinel notification is
 * sent on the same channel, and notifications are delivered in commit order, so the sentinel comes
 * first exactly when the insert sent nothing.
 */
import { TestDatabase } from "@awa/testing"
import { PgClient, PgConnection } from "@effect/sql-pg"
import { assert, describe, it } from "@effect/vitest"
import { Deferred, Effect, Fiber, Layer, Queue } from "effect"
import { layer as pgLayer } from "../src/PgQueueStorage.ts"
import { QueueStorage } from "../src/QueueStorage.ts"
import { fresh } from "./pgFixtures.ts"

const StorageLive = pgLayer().pipe(Layer.provideMerge(TestDatabase.layer()))

/** The wake channel's notifications, and the payload of the next one after a sentinel is sent. */
const listener = Effect.gen(function* () {
  const sql = yield* PgClient.PgClient
  const wakes = yield* sql.listen("awa_wake_awa")
  /** The first payload delivered after everything committed so far, once a sentinel follows it. */
  const firstAfterCommits = Effect.gen(function* () {
    yield* sql`SELECT pg_notify('awa_wake_awa', 'sentinel')`
    const first = (yield* Queue.take(wakes)).payload
    // drain up to the sentinel, so the next look starts clean
    if (first !== "sentinel") while ((yield* Queue.take(wakes)).payload !== "sentinel") {}
    return first
  })
  return { firstAfterCommits }
})

/** A session of its own, as a worker's signals connection: it holds waiter buckets. */
const waiterSession = Effect.gen(function* () {
  const sql = yield* PgClient.PgClient
  const session = yield* PgConnection.make(sql.config)
  const bucket = "awa.lock_ns('waiters'), awa.waiter_bucket($1)"
  const tryWait = (queue: string) =>
    Effect.map(
      session.query(`SELECT pg_try_advisory_lock_shared(${bucket}) AS taken`, [queue]),
      (r) => r.rows[0]!.taken === true
    )
  const stopWaiting = (queue: string) =>
    Effect.asVoid(session.query(`SELECT pg_advisory_unlock_shared(${bucket})`, [queue]))
  return { tryWait, stopWaiting }
})

const one = (queue: string) => [{ kind: "k", queue, args: {} }]
const three = (queue: string) => [1, 2, 3].map((n) => ({ kind: "k", queue, args: { n } }))

describe("wake-ups on demand (migration 0051)", () => {
  it.live("a new install has them on", () =>
    Effect.gen(function* () {
      assert.isTrue(yield* (yield* QueueStorage).wakeOnDemand)
    }).pipe(Effect.provide(StorageLive))
  )

  it.live("an insert wakes its queue only while a session waits on it: one job and a batch", () =>
    Effect.scoped(
      Effect.gen(function* () {
        const storage = yield* QueueStorage
        const { firstAfterCommits } = yield* listener
        const waiter = yield* waiterSession
        const q = fresh("demand")

        // nobody waits: neither path notifies
        yield* storage.enqueueMany(one(q))
        assert.strictEqual(yield* firstAfterCommits, "sentinel", "enqueue_one with nobody waiting")
        yield* storage.enqueueMany(three(q))
        assert.strictEqual(yield* firstAfterCommits, "sentinel", "enqueue_batch with nobody waiting")

        // a worker waits on the queue: both notify
        assert.isTrue(yield* waiter.tryWait(q))
        yield* storage.enqueueMany(one(q))
        assert.strictEqual(yield* firstAfterCommits, q, "enqueue_one with a waiter")
        yield* storage.enqueueMany(three(q))
        assert.strictEqual(yield* firstAfterCommits, q, "enqueue_batch with a waiter")

        // it stopped waiting: silent again
        yield* waiter.stopWaiting(q)
        yield* storage.enqueueMany(one(q))
        assert.strictEqual(yield* firstAfterCommits, "sentinel", "enqueue_one after the waiter left")
      })
    ).pipe(Effect.provide(StorageLive))
  )

  it.live("turned off, every insert wakes its queue, waiter or not", () =>
    Effect.scoped(
      Effect.gen(function* () {
        const storage = yield* QueueStorage
        const { firstAfterCommits } = yield* listener
        const q = fresh("off")
        yield* storage.setWakeOnDemand(false)
        assert.isFalse(yield* storage.wakeOnDemand)
        yield* storage.enqueueMany(one(q))
        assert.strictEqual(yield* firstAfterCommits, q, "enqueue_one")
        yield* storage.enqueueMany(three(q))
        assert.strictEqual(yield* firstAfterCommits, q, "enqueue_batch")
        yield* storage.setWakeOnDemand(true)
        yield* storage.enqueueMany(one(q))
        assert.strictEqual(yield* firstAfterCommits, "sentinel", "on again")
      })
    ).pipe(Effect.provide(StorageLive))
  )

  it.live("an insert that sent no wake-up holds its queue's bucket until it commits", () =>
    Effect.scoped(
      Effect.gen(function* () {
        const sql = yield* PgClient.PgClient
        const storage = yield* QueueStorage
        const waiter = yield* waiterSession
        const q = fresh("held")
        const inserted = yield* Deferred.make<void>()
        const commit = yield* Deferred.make<void>()
        const producer = yield* sql
          .withTransaction(
            Effect.andThen(
              storage.enqueueMany(one(q)),
              Effect.andThen(Deferred.succeed(inserted, undefined), Deferred.await(commit))
            )
          )
          .pipe(Effect.forkChild({ startImmediately: true }))
        yield* Deferred.await(inserted)
        // a worker that would start waiting now is told the bucket is busy (it claims again later)
        assert.isFalse(yield* waiter.tryWait(q), "taken while the insert is open")
        yield* Deferred.succeed(commit, undefined)
        yield* Fiber.join(producer)
        assert.isTrue(yield* waiter.tryWait(q), "free once it committed")
      })
    ).pipe(Effect.provide(StorageLive))
  )
})
