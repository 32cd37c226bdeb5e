/**
 * Property 5 of issue 14 (storage-engine review M7): many idle queues on one worker cost few
 * claims, and a job on any of them is still picked up at once on a wake-up, and within
 * `idlePollMax × 1.2` when its wake-up is lost. On the simulation layer with virtual time, and a
 * signals layer the test drives (subscribed, then the wake-ups the test sends), so the counts and
 * latencies are exact.
 */
import { Job } from "@awa/core"
import {
  CronStorage,
  FlowStorage,
  LeaderLock,
  QueueStorage,
  SimQueueStorage,
  StorageSignals
} from "@awa/storage"
import { assert, describe, it } from "@effect/vitest"
import { Clock, Effect, Exit, Layer, Queue, Schema, Scope, Stream } from "effect"
import { TestClock } from "effect/testing"
import * as Awa from "../src/Awa.ts"
import * as AwaClient from "../src/AwaClient.ts"
import { handler } from "../src/Handler.ts"

const Task = Job.define({ kind: "idle_task", args: Schema.Struct({ n: Schema.Number }), queue: "q0" })

const advance = (ms: number, stepMs: number) =>
  Effect.gen(function* () {
    for (let t = 0; t < ms; t += stepMs) {
      yield* TestClock.adjust(Math.min(stepMs, ms - t))
      for (let i = 0; i < 5; i++) yield* Effect.yieldNow
    }
  })

/** Simulation storage whose claims are counted per queue, and signals the test controls. */
const harness = (listening: boolean) =>
  Effect.gen(function* () {
    const claims = new Map<string, number>()
    const wakes = yield* Queue.unbounded<StorageSignals.Signal>()
    const counting = Layer.effect(
      QueueStorage,
      Effect.map(QueueStorage, (s) =>
        QueueStorage.of({
          ...s,
          claim: (params) =>
            Effect.suspend(() => {
              claims.set(params.queue, (claims.get(params.queue) ?? 0) + 1)
              return s.claim(params)
            })
        })
      )
    ).pipe(Layer.provide(SimQueueStorage.layer))
    const signals = listening
      ? Layer.succeed(
          StorageSignals.StorageSignals,
          StorageSignals.StorageSignals.of({
            signals: Stream.concat(
              Stream.succeed<StorageSignals.Signal>({ _tag: "Subscribed" }),
              Stream.fromQueue(wakes)
            )
          })
        )
      : StorageSignals.layerSilent
    const layer = AwaClient.layer().pipe(
      Layer.provideMerge(
        Layer.mergeAll(CronStorage.layerSim, FlowStorage.layerSim, signals, LeaderLock.layerMemory).pipe(
          Layer.provideMerge(counting)
        )
      )
    )
    const total = () => [...claims.values()].reduce((a, b) => a + b, 0)
    return { layer, claims, total, wake: (queue: string) => Queue.offer(wakes, { _tag: "Wake", queue }) }
  })

const queueCount = 100
const queueNames = Array.from({ length: queueCount }, (_, i) => `q${i}`)

const startWorker = (ran: Array<{ n: number; at: number }>) =>
  Effect.gen(function* () {
    const scope = yield* Scope.make()
    yield* Layer.buildWithScope(
      Awa.worker({
        queues: Object.fromEntries(queueNames.map((q) => [q, {}])),
        handlers: [
          handler(Task, (args) =>
            Effect.flatMap(Clock.currentTimeMillis, (at) =>
              Effect.sync(() => {
                ran.push({ n: args.n, at })
              })
            )
          )
        ],
        maintenance: { electionInterval: "1 second", promoteInterval: "1 second", rescueInterval: "1 minute" }
      }),
      scope
    )
    return Scope.close(scope, Exit.void)
  })

describe("Dispatcher idle polling (issue 14, property 5)", () => {
  it.effect(
    "100 idle queues while listening: claims back off to one per queue per ~30 s; a woken job starts at once, one with a lost wake-up within 36 s",
    () =>
      Effect.gen(function* () {
        const h = yield* harness(true)
        yield* Effect.gen(function* () {
          const ran: Array<{ n: number; at: number }> = []
          const stop = yield* startWorker(ran)
          // the backoff ramps up (200 ms … 30 s, 8 doublings); then measure one idle minute
          yield* advance(60_000, 100)
          const before = h.total()
          yield* advance(60_000, 100)
          const perQueuePerMinute = (h.total() - before) / queueCount
          // 300 a minute per queue at a fixed 200 ms poll; about 2 at a 30 s ± 20 % poll
          assert.isAtMost(perQueuePerMinute, 3, `claims per idle queue per minute: ${perQueuePerMinute}`)
          assert.isAtLeast(perQueuePerMinute, 1)

          const storage = yield* QueueStorage
          // a wake-up: picked up at once
          let t0 = yield* Clock.currentTimeMillis
          yield* storage.enqueueMany([{ kind: "idle_task", queue: "q57", args: { n: 1 } }])
          yield* h.wake("q57")
          yield* advance(50, 10)
          assert.deepStrictEqual(
            ran.map((r) => [r.n, r.at - t0 <= 50]),
            [[1, true]]
          )
          // a lost wake-up: the queue's backed-off poll finds it within 1.2 × 30 s
          yield* advance(60_000, 100)
          t0 = yield* Clock.currentTimeMillis
          yield* storage.enqueueMany([{ kind: "idle_task", queue: "q83", args: { n: 2 } }])
          yield* advance(36_100, 100)
          assert.strictEqual(ran.length, 2, "the job of the lost wake-up ran")
          assert.isAtMost(ran[1]!.at - t0, 36_100)
          yield* stop
        }).pipe(Effect.provide(h.layer))
      })
  )

  it.effect("without a listener (notifications off) the poll stays at the poll interval", () =>
    Effect.gen(function* () {
      const h = yield* harness(false)
      yield* Effect.gen(function* () {
        const stop = yield* startWorker([])
        yield* advance(10_000, 100)
        const before = h.total()
        yield* advance(10_000, 100)
        const perQueuePerSecond = (h.total() - before) / queueCount / 10
        // 5 a second at 200 ms (a 100 ms step lets one poll slip now and then)
        assert.isAtLeast(perQueuePerSecond, 3.5)
        yield* stop
      }).pipe(Effect.provide(h.layer))
    })
  )
})
