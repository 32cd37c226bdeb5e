/**
 * Claim order between lanes under concurrent claimers (migration 0025): a claimer that finds the
 * best-ranked lane held by another claimer (a claim in flight: milliseconds) waits for it briefly
 * instead of taking a worse-ranked lane meanwhile, and gives way to the next lane only when the
 * wait runs out.
 */
import { assert, describe, it } from "@effect/vitest"
import { Deferred, Effect, Fiber, Schedule } from "effect"
import { QueueStorage } from "../src/QueueStorage.ts"
import { claimOf, fresh, holdOpenUntil, someoneWaits, withEagerDatabase } from "./pgFixtures.ts"

const job = (queue: string, priority: number, n: number) => ({ kind: "order", queue, priority, args: { n } })

/** Holds lane `(queue, priority, 0)`'s claim lock in a transaction of its own, as a claim in flight does. */
const holdLane = (url: string, queue: string, priority: number, release: Deferred.Deferred<void>) =>
  holdOpenUntil(
    url,
    `SELECT pg_advisory_xact_lock(awa.lock_ns('claim'), awa.lane_key('${queue}', ${priority}, 0))`,
    release
  )

/** Waits until `claimer` queues behind a held lane (with 0025) or has come back (without it). */
const queuedOrDone = <A, E>(claimer: Fiber.Fiber<A, E>) =>
  Effect.gen(function* () {
    if (claimer.pollUnsafe() !== undefined) return
    if (!(yield* someoneWaits)) return yield* Effect.fail("not yet" as const)
  }).pipe(Effect.retry(Schedule.spaced("5 millis")))

describe("claim order between lanes", () => {
  it.live(
    "a claimer waits for the best-ranked lane held by another claimer rather than take a worse one",
    () =>
      withEagerDatabase({}, (url) =>
        Effect.gen(function* () {
          const storage = yield* QueueStorage
          const q = fresh("rank")
          yield* storage.enqueueMany([
            ...Array.from({ length: 4 }, (_, n) => job(q, 2, n)),
            ...Array.from({ length: 4 }, (_, n) => job(q, 1, n))
          ])
          const release = yield* Deferred.make<void>()
          const holder = yield* holdLane(url, q, 1, release)
          const claimer = yield* storage
            .claim(claimOf(q, 2))
            .pipe(Effect.forkChild({ startImmediately: true }))
          yield* queuedOrDone(claimer)
          yield* Deferred.succeed(release, undefined)
          yield* Fiber.join(holder)
          const claimed = yield* Fiber.join(claimer)
          assert.deepStrictEqual(
            claimed.map((c) => c.priority),
            [1, 1],
            "priority 2 was claimed while priority 1 had work"
          )
        })
      )
  )

  it.live("after waiting it fills the batch from the next lanes in rank order", () =>
    withEagerDatabase({}, (url) =>
      Effect.gen(function* () {
        const storage = yield* QueueStorage
        const q = fresh("fill")
        yield* storage.enqueueMany([
          job(q, 1, 0),
          ...Array.from({ length: 4 }, (_, n) => job(q, 3, n)),
          job(q, 2, 0)
        ])
        const release = yield* Deferred.make<void>()
        const holder = yield* holdLane(url, q, 1, release)
        const claimer = yield* storage.claim(claimOf(q, 4)).pipe(Effect.forkChild({ startImmediately: true }))
        yield* queuedOrDone(claimer)
        yield* Deferred.succeed(release, undefined)
        yield* Fiber.join(holder)
        const claimed = yield* Fiber.join(claimer)
        assert.deepStrictEqual(
          claimed.map((c) => c.priority),
          [1, 2, 3, 3]
        )
      })
    )
  )

  it.live("a lane held past the wait gives way: the claimer takes the next lane instead of idling", () =>
    withEagerDatabase({}, (url) =>
      Effect.gen(function* () {
        const storage = yield* QueueStorage
        const q = fresh("giveway")
        yield* storage.enqueueMany([job(q, 1, 0), job(q, 2, 0), job(q, 2, 1)])
        const release = yield* Deferred.make<void>()
        const holder = yield* holdLane(url, q, 1, release)
        // the lane stays held until the claim has come back
        const claimed = yield* storage.claim(claimOf(q, 2))
        yield* Deferred.succeed(release, undefined)
        yield* Fiber.join(holder)
        assert.deepStrictEqual(
          claimed.map((c) => c.priority),
          [2, 2]
        )
        // and the held lane's job is still there, first in line
        const [next] = yield* storage.claim(claimOf(q, 1))
        assert.strictEqual(next?.priority, 1)
      })
    )
  )
})
