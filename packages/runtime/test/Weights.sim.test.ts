/**
 * Weighted concurrency on the simulation layer with virtual time (capabilities.md §13): a global
 * pool of 24 permits, floors of 2, weights 3 and 1. Concurrency is counted by the handlers
 * themselves (running now, per queue), sampled after every 10 ms step and at every start.
 */
import { AwaConfigError, Job } from "@awa/core"
import { assert, describe, it } from "@effect/vitest"
import { Context, Effect, Exit, Fiber, Layer, Schema, Scope } from "effect"
import { TestClock } from "effect/testing"
import * as Awa from "../src/Awa.ts"
import { AwaClient } from "../src/AwaClient.ts"
import { handler } from "../src/Handler.ts"
import { Worker, type WorkerOptions } from "../src/Worker.ts"
import { advance } from "./support.ts"

const Heavy = Job.define({ kind: "heavy_job", args: Schema.Struct({ n: Schema.Number }), queue: "heavy" })
const Light = Job.define({ kind: "light_job", args: Schema.Struct({ n: Schema.Number }), queue: "light" })

interface Counts {
  running: Record<"heavy" | "light", number>
  done: Record<"heavy" | "light", number>
  maxRunning: Record<"heavy" | "light", number>
  maxTotal: number
}

const newCounts = (): Counts => ({
  running: { heavy: 0, light: 0 },
  done: { heavy: 0, light: 0 },
  maxRunning: { heavy: 0, light: 0 },
  maxTotal: 0
})

/** A handler that counts itself running for `ms` of virtual time. */
const counting = (counts: Counts, queue: "heavy" | "light", ms: number) =>
  Effect.acquireUseRelease(
    Effect.sync(() => {
      counts.running[queue]++
      counts.maxRunning[queue] = Math.max(counts.maxRunning[queue], counts.running[queue])
      counts.maxTotal = Math.max(counts.maxTotal, counts.running.heavy + counts.running.light)
    }),
    () => Effect.sleep(ms),
    () =>
      Effect.sync(() => {
        counts.running[queue]--
        counts.done[queue]++
      })
  )

const startWorker = <R>(options: WorkerOptions<R>) =>
  Effect.gen(function* () {
    const scope = yield* Scope.make()
    const context = yield* Layer.buildWithScope(Awa.worker(options), scope)
    return { worker: Context.get(context, Worker), stop: Scope.close(scope, Exit.void) }
  })

const weightedWorker = (
  counts: Counts,
  options: {
    readonly heavy?: { minWorkers?: number; weight?: number }
    readonly light?: { minWorkers?: number; weight?: number }
    readonly ms?: { heavy: number; light: number }
  } = {}
) =>
  startWorker({
    globalMaxWorkers: 24,
    queues: {
      heavy: { pollInterval: "20 millis", minWorkers: 2, weight: 3, ...options.heavy },
      light: { pollInterval: "20 millis", minWorkers: 2, weight: 1, ...options.light }
    },
    handlers: [
      handler(Heavy, () => counting(counts, "heavy", options.ms?.heavy ?? 100)),
      handler(Light, () => counting(counts, "light", options.ms?.light ?? 100))
    ],
    maintenance: false
  })

const range = (n: number) => Array.from({ length: n }, (_, i) => ({ n: i }))

/** Advances `ms` in 10 ms steps, calling `sample` after each. */
const sampled = (ms: number, sample: () => void) =>
  Effect.gen(function* () {
    for (let t = 0; t < ms; t += 10) {
      yield* TestClock.adjust(10)
      for (let i = 0; i < 5; i++) yield* Effect.yieldNow
      sample()
    }
  })

/** Stops the worker while virtual time moves on: shutdown waits for the handlers still sleeping. */
const finish = (stop: Effect.Effect<void>, ms = 3000) =>
  Effect.gen(function* () {
    const stopping = yield* Effect.forkChild(stop, { startImmediately: true })
    yield* advance(ms)
    yield* Fiber.join(stopping)
  })

describe("weighted concurrency (simulation layer, TestClock)", () => {
  it.effect(
    "global 24, floors 2, weight 3 vs 1 under saturation: 17 and 7 at once, completions ≈ 17:7 (overflow 15:5 = 3:1), the cap never exceeded",
    () =>
      Effect.gen(function* () {
        const client = yield* AwaClient
        yield* client.insertMany(Heavy, range(3000))
        yield* client.insertMany(Light, range(3000))
        const counts = newCounts()
        const { stop, worker } = yield* weightedWorker(counts)
        let minLight = Number.POSITIVE_INFINITY
        // the first claims may come before the other queue has asked: measure once shares settle
        yield* sampled(1000, () => {})
        const warm = { ...counts.done }
        counts.maxRunning = { heavy: 0, light: 0 }
        yield* sampled(5000, () => {
          minLight = Math.min(minLight, counts.running.light)
        })
        const heavy = counts.done.heavy - warm.heavy
        const light = counts.done.light - warm.light
        assert.isAtMost(counts.maxTotal, 24, "the global cap, warm-up included")
        assert.strictEqual(counts.maxTotal, 24, "saturated")
        assert.strictEqual(counts.maxRunning.heavy, 17, "floor 2 + ceil(20 × 3/4)")
        assert.strictEqual(counts.maxRunning.light, 7, "floor 2 + ceil(20 × 1/4)")
        assert.isAtLeast(minLight, 2, "the light queue's floor holds under load")
        // 100 ms handlers: ≈ 170 and 70 per second
        const ratio = heavy / light
        assert.isAbove(ratio, (17 / 7) * 0.9, `completions ${heavy}:${light}`)
        assert.isBelow(ratio, (17 / 7) * 1.1, `completions ${heavy}:${light}`)
        const overflowRatio = (heavy - 2 * 50) / (light - 2 * 50)
        assert.isAbove(overflowRatio, 2.7, `overflow completions ${heavy - 100}:${light - 100}`)
        assert.isBelow(overflowRatio, 3.3, `overflow completions ${heavy - 100}:${light - 100}`)
        const snapshot = yield* worker.permits
        assert.strictEqual(snapshot?.mode, "weighted")
        assert.strictEqual(snapshot?.overflow, 20)
        assert.deepStrictEqual(
          snapshot?.queues.map((q) => [q.queue, q.minWorkers, q.weight]),
          [
            ["heavy", 2, 3],
            ["light", 2, 1]
          ]
        )
        yield* finish(stop)
      }).pipe(Effect.provide(Awa.layerSim()))
  )

  it.effect(
    "idle overflow moves to the loaded queue, and back when the idle queue gets work; its floor is there at once",
    () =>
      Effect.gen(function* () {
        const client = yield* AwaClient
        const counts = newCounts()
        // long heavy handlers: the overflow they hold comes back only as they finish
        const { stop } = yield* weightedWorker(counts, { ms: { heavy: 1000, light: 100 } })
        yield* client.insertMany(Heavy, range(2000))
        yield* sampled(300, () => {})
        assert.strictEqual(counts.running.heavy, 22, "all 20 overflow permits plus its floor: light is idle")
        assert.strictEqual(counts.running.light, 0)
        yield* client.insertMany(Light, range(2000))
        // the floor is reserved: light starts 2 at once although heavy holds every overflow permit
        yield* sampled(50, () => {})
        assert.strictEqual(counts.running.light, 2)
        assert.strictEqual(counts.running.heavy, 22)
        // as heavy's 1 s handlers end, the overflow is shared again by weight
        yield* sampled(2500, () => {})
        assert.strictEqual(counts.running.heavy, 17)
        assert.strictEqual(counts.running.light, 7)
        assert.isAtMost(counts.maxTotal, 24)
        yield* finish(stop, 2000)
      }).pipe(Effect.provide(Awa.layerSim()))
  )

  it.effect(
    "hard-reserved mode is unchanged when globalMaxWorkers is absent: each queue its own maxConcurrency",
    () =>
      Effect.gen(function* () {
        const client = yield* AwaClient
        yield* client.insertMany(Heavy, range(500))
        yield* client.insertMany(Light, range(500))
        const counts = newCounts()
        const { stop, worker } = yield* startWorker({
          queues: {
            heavy: { pollInterval: "20 millis", maxConcurrency: 5 },
            light: { pollInterval: "20 millis", maxConcurrency: 3 }
          },
          handlers: [
            handler(Heavy, () => counting(counts, "heavy", 100)),
            handler(Light, () => counting(counts, "light", 100))
          ],
          maintenance: false
        })
        yield* sampled(1000, () => {})
        assert.strictEqual(counts.maxRunning.heavy, 5)
        assert.strictEqual(counts.maxRunning.light, 3)
        assert.isUndefined(yield* worker.permits)
        yield* finish(stop)
      }).pipe(Effect.provide(Awa.layerSim()))
  )

  it.effect(
    "an empty claim gives its permits back (in the claim's release step), and each job its own when done",
    () =>
      Effect.gen(function* () {
        const client = yield* AwaClient
        const counts = newCounts()
        const { stop, worker } = yield* weightedWorker(counts)
        // nothing to claim: every claim comes back empty and must hand its permits back
        yield* sampled(500, () => {})
        const idle = yield* worker.permits
        assert.deepStrictEqual(
          idle?.queues.map((q) => [q.queue, q.held, q.demand]),
          [
            ["heavy", 0, false],
            ["light", 0, false]
          ]
        )
        yield* client.insertMany(Light, range(10))
        yield* sampled(2000, () => {})
        assert.strictEqual(counts.done.light, 10)
        const after = yield* worker.permits
        assert.strictEqual(
          after?.queues.find((q) => q.queue === "light")?.held,
          0,
          "every job gave its permit back"
        )
        yield* finish(stop)
      }).pipe(Effect.provide(Awa.layerSim()))
  )

  it.effect("invalid weighted settings fail the layer with AwaConfigError", () =>
    Effect.gen(function* () {
      const exit = yield* Effect.exit(
        startWorker<never>({
          globalMaxWorkers: 4,
          queues: {
            a: { minWorkers: 3, weight: 0 },
            b: { minWorkers: 2, weight: 1001 }
          },
          handlers: [],
          maintenance: false
        })
      )
      const reason = Exit.isFailure(exit) ? exit.cause.reasons[0] : undefined
      const failure = reason !== undefined && reason._tag === "Fail" ? reason.error : undefined
      assert.instanceOf(failure, AwaConfigError)
      assert.deepStrictEqual(
        (failure as AwaConfigError).issues.map((i) => i.path),
        ["queues.a.weight", "queues.b.weight", "globalMaxWorkers"]
      )
      const unweighted = yield* Effect.exit(
        startWorker<never>({ queues: { a: { weight: 2 } }, handlers: [], maintenance: false })
      )
      assert.isTrue(Exit.isFailure(unweighted), "weight without globalMaxWorkers")
    }).pipe(Effect.provide(Awa.layerSim()))
  )
})
