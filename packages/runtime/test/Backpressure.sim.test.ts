/**
 * Backpressure at insert and the paced producer on the simulation layer (capabilities.md §25).
 */
import { BackpressureRejected, Job, ValidationError } from "@awa/core"
import { CronStorage, FlowStorage, LeaderLock, SimQueueStorage, StorageSignals } from "@awa/storage"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Exit, Fiber, Layer, Schema, Scope } from "effect"
import { TestClock } from "effect/testing"
import * as Awa from "../src/Awa.ts"
import * as AwaClient from "../src/AwaClient.ts"
import { handler } from "../src/Handler.ts"
import * as PacedProducer from "../src/PacedProducer.ts"
import { advance } from "./support.ts"

const Item = Job.define({ kind: "item", args: Schema.Struct({ n: Schema.Number }), queue: "bp" })
const range = (n: number) => Array.from({ length: n }, (_, i) => ({ n: i }))

/** Virtual time in 10 ms steps with enough turns between them for a producer, a worker and its batcher. */
const busyAdvance = (ms: number) =>
  Effect.gen(function* () {
    for (let t = 0; t < ms; t += 10) {
      yield* TestClock.adjust(10)
      for (let i = 0; i < 40; i++) yield* Effect.yieldNow
    }
  })

/** The simulation layers with a probe counting depth queries. */
const ProbedSim = AwaClient.layer().pipe(
  Layer.provideMerge(
    Layer.mergeAll(
      CronStorage.layerSim,
      FlowStorage.layerSimProbed,
      StorageSignals.layerSilent,
      LeaderLock.layerMemory
    ).pipe(Layer.provideMerge(SimQueueStorage.layer))
  )
)

describe("backpressure at insert (simulation layer)", () => {
  it.effect('"off" (and no option) adds no depth query; "signal" adds one per cache window', () =>
    Effect.gen(function* () {
      const client = yield* AwaClient.AwaClient
      const probe = yield* FlowStorage.SimDepthProbe
      yield* client.insertMany(Item, range(5))
      yield* client.insert(Item, { n: 1 }, { backpressure: "off" })
      assert.strictEqual(probe.depthCalls(), 0)
      const first = yield* client.insert(Item, { n: 2 }, { backpressure: "signal" })
      assert.deepStrictEqual(first.pressure, { queue: "bp", depth: 6, capped: false })
      assert.strictEqual(probe.depthCalls(), 1)
      // within the cache window the reading is reused: no query, the same depth
      yield* TestClock.adjust(500)
      const second = yield* client.insert(Item, { n: 3 }, { backpressure: "signal" })
      assert.strictEqual(second.pressure?.depth, 6)
      assert.strictEqual(probe.depthCalls(), 1)
      // after it, a fresh count tracks the depth
      yield* TestClock.adjust(600)
      const third = yield* client.insert(Item, { n: 4 }, { backpressure: "signal" })
      assert.deepStrictEqual(third.pressure, { queue: "bp", depth: 8, capped: false })
      assert.strictEqual(probe.depthCalls(), 2)
    }).pipe(Effect.provide(ProbedSim))
  )

  it.effect("reject: a batch is refused whole at the limit with BackpressureRejected, nothing written", () =>
    Effect.gen(function* () {
      const client = yield* AwaClient.AwaClient
      yield* client.insertMany(Item, range(9))
      // below the limit: admitted whole, even though it takes the queue past it
      yield* client.insertMany(Item, range(3), { backpressure: { reject: { limit: 10 } } })
      yield* TestClock.adjust(1001)
      const error = yield* Effect.flip(
        client.insertMany(Item, range(3), { backpressure: { reject: { limit: 10 } } })
      )
      assert.instanceOf(error, BackpressureRejected)
      assert.deepStrictEqual(
        { ...error },
        { _tag: "BackpressureRejected", queue: "bp", depth: 10, limit: 10 }
      )
      const stats = yield* client.storage.queueStats()
      assert.strictEqual(
        stats.queues.find((q) => q.queue === "bp")?.available,
        12,
        "none of the refused batch"
      )
      const bad = yield* Effect.flip(
        client.insert(Item, { n: 0 }, { backpressure: { reject: { limit: 0 } } })
      )
      assert.instanceOf(bad, ValidationError)
      assert.strictEqual((bad as ValidationError).field, "backpressure")
    }).pipe(Effect.provide(Awa.layerSim()))
  )

  it.effect(
    "PacedProducer converges under oversupply: 500/s offered against 50/s of work, depth held near its target",
    () =>
      Effect.gen(function* () {
        const client = yield* AwaClient.AwaClient
        const scope = yield* Scope.make()
        // 5 workers × 100 ms = 50 jobs/s of capacity
        yield* Layer.buildWithScope(
          Awa.worker({
            queues: { bp: { maxConcurrency: 5, prefetch: 0, pollInterval: "20 millis" } },
            handlers: [handler(Item, () => Effect.sleep(100))],
            maintenance: false
          }),
          scope
        )
        const paced = yield* PacedProducer.make({ queue: "bp", targetDepth: 100, initialRate: 500 }).pipe(
          Scope.provide(scope)
        )
        let sent = 0
        const producer = yield* Effect.forkChild(
          Effect.forever(
            paced.pace.pipe(
              Effect.andThen(Effect.suspend(() => client.insert(Item, { n: sent }))),
              Effect.andThen(
                Effect.sync(() => {
                  sent++
                })
              )
            )
          )
        )
        const depth = () =>
          Effect.map(
            client.storage.queueStats(),
            (s) => s.queues.find((q) => q.queue === "bp")?.available ?? 0
          )
        yield* busyAdvance(20_000)
        const sentAt20 = sent
        let maxDepth = 0
        for (let s = 0; s < 40; s++) {
          yield* busyAdvance(1000)
          maxDepth = Math.max(maxDepth, yield* depth())
        }
        const rate = (sent - sentAt20) / 40
        // unpaced, the depth would grow by 450 a second (18,000 after 40 s)
        assert.isAtMost(maxDepth, 300, "depth stays within 3 × target after convergence")
        assert.isAbove(rate, 40, `send rate ${rate}/s settles near the 50/s completed`)
        assert.isBelow(rate, 60, `send rate ${rate}/s settles near the 50/s completed`)
        yield* Fiber.interrupt(producer)
        const closing = yield* Effect.forkChild(Scope.close(scope, Exit.void), { startImmediately: true })
        yield* advance(2000)
        yield* Fiber.join(closing)
      }).pipe(Effect.provide(Awa.layerSim()))
  )

  it("the rate law: what was drained plus the gap to the target over five intervals; halved when capped", () => {
    const bounds = { min: 1, max: 1000 }
    const base = { rate: 100, intervalMs: 1000, target: 100 }
    // sent 100, depth grew 50 → drained 50/s; 50 over target → −10/s
    const at = (count: number, capped = false) => ({ count, capped })
    assert.strictEqual(
      PacedProducer.nextRate({ ...base, previous: at(100), depth: at(150), sent: 100 }, bounds),
      40
    )
    // empty queue: everything sent was drained, plus 20/s of headroom
    assert.strictEqual(
      PacedProducer.nextRate({ ...base, previous: at(0), depth: at(0), sent: 30 }, bounds),
      50
    )
    assert.strictEqual(
      PacedProducer.nextRate({ ...base, previous: at(200, true), depth: at(200, true), sent: 9 }, bounds),
      50
    )
    assert.strictEqual(
      PacedProducer.nextRate(
        { ...base, rate: 1, previous: undefined, depth: at(200, true), sent: 0 },
        bounds
      ),
      1
    )
  })
})
