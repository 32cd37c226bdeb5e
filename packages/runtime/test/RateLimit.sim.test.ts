/**
 * Per-queue rate limiting on the simulation layer with virtual time (capabilities.md §12): the
 * timings here are exact.
 */
import { AwaConfigError, Job } from "@awa/core"
import { assert, describe, it } from "@effect/vitest"
import { Clock, Effect, Exit, Layer, Schema, Scope } from "effect"
import * as Awa from "../src/Awa.ts"
import { AwaClient } from "../src/AwaClient.ts"
import { handler } from "../src/Handler.ts"
import * as RateLimiter from "../src/RateLimiter.ts"
import type { WorkerOptions } from "../src/Worker.ts"
import { advance } from "./support.ts"

const Tick = Job.define({ kind: "tick", args: Schema.Struct({ n: Schema.Number }), queue: "limited" })
const Slow = Job.define({ kind: "slow", args: Schema.Struct({ n: Schema.Number }), queue: "limited" })

const startWorker = <R>(options: WorkerOptions<R>) =>
  Effect.gen(function* () {
    const scope = yield* Scope.make()
    yield* Layer.buildWithScope(Awa.worker(options), scope)
    return Scope.close(scope, Exit.void)
  })

/** A worker on queue "limited" whose handlers record their start instants (virtual ms). */
const recordingWorker = (queue: Parameters<typeof startWorker>[0]["queues"][string], starts: Array<number>) =>
  startWorker({
    queues: { limited: { pollInterval: "50 millis", ...queue } },
    handlers: [
      handler(Tick, () =>
        Effect.flatMap(Clock.currentTimeMillis, (t) =>
          Effect.sync(() => {
            starts.push(t)
          })
        )
      ),
      handler(Slow, () =>
        Effect.flatMap(Clock.currentTimeMillis, (t) =>
          Effect.sync(() => {
            starts.push(t)
          })
        ).pipe(Effect.andThen(Effect.sleep("1 second")))
      )
    ],
    maintenance: false
  })

const range = (n: number) => Array.from({ length: n }, (_, i) => ({ n: i }))

describe("rate limiting (simulation layer, TestClock)", () => {
  it.effect(
    "30 jobs at 10/s with burst 10: the first 10 at once, then one every 100 ms; ≥ 1.5 s in all",
    () =>
      Effect.gen(function* () {
        const client = yield* AwaClient
        yield* client.insertMany(Tick, range(30))
        const starts: Array<number> = []
        const t0 = yield* Clock.currentTimeMillis
        const stop = yield* recordingWorker(
          { maxConcurrency: 50, rateLimit: { maxRate: 10, burst: 10 } },
          starts
        )
        yield* advance(5000)
        assert.strictEqual(starts.length, 30)
        const span = starts[29]! - t0
        assert.isAtLeast(span, 1500, "30 jobs at 10/s burst 10")
        // exactly: 20 tokens after the burst take 2 s to refill; a claim waits for its token only
        assert.isAtLeast(span, 2000)
        assert.isAtMost(span, 2100)
        // burst then throttle: 10 start together, then never more than 1 in any 100 ms
        assert.isAtMost(starts[9]! - t0, 20)
        for (let i = 10; i < 30; i++) assert.isAtLeast(starts[i]! - t0, (i - 9) * 100 - 1, `start ${i}`)
        yield* stop
      }).pipe(Effect.provide(Awa.layerSim()))
  )

  it.effect("burst 0 means max(1, ceil(maxRate)): at 2.5/s three start at once", () =>
    Effect.gen(function* () {
      const client = yield* AwaClient
      yield* client.insertMany(Tick, range(6))
      const starts: Array<number> = []
      const t0 = yield* Clock.currentTimeMillis
      const stop = yield* recordingWorker({ rateLimit: { maxRate: 2.5, burst: 0 } }, starts)
      yield* advance(200)
      assert.strictEqual(starts.length, 3)
      yield* advance(600)
      assert.strictEqual(starts.length, 5, "2 more tokens in the next 0.8 s")
      assert.isAtMost(starts[2]! - t0, 20)
      // the last completion is still batched: shutdown flushes it in virtual time
      yield* advance(100)
      yield* stop
    }).pipe(Effect.provide(Awa.layerSim()))
  )

  it.effect("tokens a short claim did not use are refunded: a later batch starts at once", () =>
    Effect.gen(function* () {
      const client = yield* AwaClient
      yield* client.insertMany(Tick, range(3))
      const starts: Array<number> = []
      const stop = yield* recordingWorker({ rateLimit: { maxRate: 1, burst: 10 } }, starts)
      yield* advance(100)
      assert.strictEqual(starts.length, 3)
      // the claim asked for 10 tokens and got 3 jobs: 7 were refunded, so 7 more start now,
      // not one a second
      const before = yield* Clock.currentTimeMillis
      yield* client.insertMany(Tick, range(7))
      yield* advance(300)
      assert.strictEqual(starts.length, 10)
      assert.isAtMost(starts[9]! - before, 300)
      yield* stop
    }).pipe(Effect.provide(Awa.layerSim()))
  )

  it.effect("a low maxConcurrency still bounds a generous rate", () =>
    Effect.gen(function* () {
      const client = yield* AwaClient
      yield* client.insertMany(Slow, range(6))
      const starts: Array<number> = []
      const t0 = yield* Clock.currentTimeMillis
      const stop = yield* recordingWorker(
        { maxConcurrency: 2, prefetch: 0, rateLimit: { maxRate: 100 } },
        starts
      )
      yield* advance(500)
      assert.strictEqual(starts.length, 2)
      yield* advance(2000)
      assert.strictEqual(starts.length, 6)
      assert.isAtLeast(starts[5]! - t0, 2000, "three rounds of two one-second handlers")
      // let the last two handlers finish: shutdown waits for them in virtual time
      yield* advance(1000)
      yield* stop
    }).pipe(Effect.provide(Awa.layerSim()))
  )

  it.effect("invalid settings fail the layer with AwaConfigError naming every field", () =>
    Effect.gen(function* () {
      const exit = yield* Effect.exit(
        startWorker<never>({
          queues: {
            a: { rateLimit: { maxRate: 0 } },
            b: { rateLimit: { maxRate: 200_000 } },
            c: { rateLimit: { maxRate: 5, burst: 1.5 } },
            d: { rateLimit: { maxRate: -1 } },
            e: { claimBatchSize: 0 }
          },
          handlers: [],
          maintenance: false
        })
      )
      assert.isTrue(Exit.isFailure(exit))
      const error = Exit.isFailure(exit) ? exit.cause.reasons[0] : undefined
      const failure = error !== undefined && error._tag === "Fail" ? error.error : undefined
      assert.instanceOf(failure, AwaConfigError)
      const paths = (failure as AwaConfigError).issues.map((i) => i.path)
      assert.deepStrictEqual(paths, [
        "queues.a.rateLimit",
        "queues.b.rateLimit",
        "queues.c.rateLimit",
        "queues.d.rateLimit",
        "queues.e.claimBatchSize"
      ])
    }).pipe(Effect.provide(Awa.layerSim()))
  )

  it("the bucket: whole tokens, continuous refill, refunds up to the bucket size, retune keeps what is held", () => {
    const bucket = RateLimiter.make({ maxRate: 10, burst: 5 }, 0)
    assert.strictEqual(bucket.take(8, 0), 5)
    assert.strictEqual(bucket.take(1, 0), 0)
    assert.closeTo(bucket.msUntilToken(0), 100, 1e-9)
    assert.strictEqual(bucket.take(3, 250), 2, "2.5 tokens after 250 ms: two whole ones")
    bucket.refund(100)
    assert.strictEqual(bucket.take(10, 250), 5, "a refund never overfills the bucket")
    bucket.retune({ maxRate: 1000, burst: 2 }, 250)
    assert.strictEqual(bucket.take(10, 252), 2)
  })
})
