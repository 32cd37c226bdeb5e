/**
 * The dispatcher's side of wake-ups on demand (migration 0051, docs/adr/0038-wake-ups-on-demand.md),
 * on the simulation layer with virtual time and a subscription whose waiters the test scripts:
 * what the dispatcher does with each answer of `waitFor`, and when it says `stopWaiting`. Every
 * queue polls once a minute, so a job that starts within milliseconds was found by the protocol's
 * own claim.
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
import { Effect, Exit, Layer, Schema, Scope, Stream } from "effect"
import { TestClock } from "effect/testing"
import * as Awa from "../src/Awa.ts"
import * as AwaClient from "../src/AwaClient.ts"
import { handler } from "../src/Handler.ts"

const queue = "demand"
const Task = Job.define({ kind: "demand_task", args: Schema.Struct({ n: Schema.Number }), queue })

const advance = (ms: number, stepMs: number) =>
  Effect.gen(function* () {
    for (let t = 0; t < ms; t += stepMs) {
      yield* TestClock.adjust(Math.min(stepMs, ms - t))
      for (let i = 0; i < 5; i++) yield* Effect.yieldNow
    }
  })

/**
 * The waiters' answers, scripted: `answer(call)` for the n-th `waitFor` (from 1), with the storage
 * at hand (an insert that slips in between a claim and the registration sends no wake-up). Every
 * call is recorded, `stopWaiting` too.
 */
const harness = (
  answer: (call: number, storage: QueueStorage["Service"]) => Effect.Effect<StorageSignals.Waiting>
) =>
  Effect.sync(() => {
    const calls: Array<string> = []
    let storage: QueueStorage["Service"] | undefined
    let n = 0
    const waiters: StorageSignals.Waiters = {
      waitFor: (q) =>
        Effect.suspend(() => {
          n += 1
          return Effect.tap(answer(n, storage!), (a) => Effect.sync(() => calls.push(`${q}:${a}`)))
        }),
      stopWaiting: (q) => Effect.sync(() => void calls.push(`${q}:stop`))
    }
    const signals = Layer.succeed(
      StorageSignals.StorageSignals,
      StorageSignals.StorageSignals.of({
        signals: Stream.concat(
          Stream.succeed<StorageSignals.Signal>({ _tag: "Subscribed", waiters }),
          Stream.never
        )
      })
    )
    const layer = AwaClient.layer().pipe(
      Layer.provideMerge(
        Layer.mergeAll(CronStorage.layerSim, FlowStorage.layerSim, signals, LeaderLock.layerMemory).pipe(
          Layer.provideMerge(SimQueueStorage.layer)
        )
      )
    )
    return { layer, calls, setStorage: (s: QueueStorage["Service"]) => (storage = s) }
  })

const startWorker = (ran: Array<number>, maxConcurrency = 10) =>
  Effect.gen(function* () {
    const scope = yield* Scope.make()
    yield* Layer.buildWithScope(
      Awa.worker({
        queues: { [queue]: { maxConcurrency, pollInterval: "60 seconds", idlePollMax: "60 seconds" } },
        handlers: [handler(Task, ({ n }) => Effect.sync(() => void ran.push(n)))],
        maintenance: false
      }),
      scope
    )
    return Scope.close(scope, Exit.void)
  })

const insert = (storage: QueueStorage["Service"], n: number) =>
  Effect.orDie(Effect.asVoid(storage.enqueueMany([{ kind: "demand_task", queue, args: { n } }])))

describe("Dispatcher: wake-ups on demand (migration 0051)", () => {
  it.effect(
    "just registered (Taken), it claims once more before sleeping: a job inserted meanwhile starts",
    () =>
      Effect.gen(function* () {
        const h = yield* harness((call, storage) =>
          call === 1 ? Effect.as(insert(storage, 1), "Taken") : Effect.succeed("Held")
        )
        yield* Effect.gen(function* () {
          h.setStorage(yield* QueueStorage)
          const ran: Array<number> = []
          const stop = yield* startWorker(ran)
          yield* advance(50, 5)
          assert.deepStrictEqual(ran, [1], "the job inserted while it registered ran at once")
          assert.deepStrictEqual(h.calls, [`${queue}:Taken`, `${queue}:Held`])
          yield* stop
        }).pipe(Effect.provide(h.layer))
      })
  )

  it.effect("an insert in flight holds the bucket (Busy): it claims again shortly until it can wait", () =>
    Effect.gen(function* () {
      const h = yield* harness((call, storage) =>
        call === 1
          ? Effect.as(insert(storage, 1), "Busy")
          : Effect.succeed(call <= 3 ? "Busy" : call === 4 ? "Taken" : "Held")
      )
      yield* Effect.gen(function* () {
        h.setStorage(yield* QueueStorage)
        const ran: Array<number> = []
        const stop = yield* startWorker(ran)
        yield* advance(50, 5)
        assert.deepStrictEqual(ran, [1], "the in-flight insert's job ran within milliseconds")
        assert.deepStrictEqual(h.calls, [
          `${queue}:Busy`,
          `${queue}:Busy`,
          `${queue}:Busy`,
          `${queue}:Taken`,
          `${queue}:Held`
        ])
        yield* stop
      }).pipe(Effect.provide(h.layer))
    })
  )

  it.effect(
    "inserts in flight one after another (Busy each time): each claim that finds a job ends the back-off",
    () =>
      Effect.gen(function* () {
        // every ask meets the next insert in flight (a steady stream of producers whose commits
        // are slow): the claim after each short wait finds that insert's job. Without the reset
        // the waits doubled (1, 2, 4 … 128 ms) although every one of those claims found work.
        const h = yield* harness((call, storage) =>
          call <= 8 ? Effect.as(insert(storage, call), "Busy") : Effect.succeed(call === 9 ? "Taken" : "Held")
        )
        yield* Effect.gen(function* () {
          h.setStorage(yield* QueueStorage)
          const ran: Array<number> = []
          const stop = yield* startWorker(ran)
          yield* advance(20, 1)
          assert.deepStrictEqual(ran, [1, 2, 3, 4, 5, 6, 7, 8], "every insert's job ran within milliseconds")
          yield* stop
        }).pipe(Effect.provide(h.layer))
      })
  )

  it.effect("a bucket held by a transaction that stays open (Busy, nothing to claim): the waits double", () =>
    Effect.gen(function* () {
      const h = yield* harness(() => Effect.succeed("Busy"))
      yield* Effect.gen(function* () {
        h.setStorage(yield* QueueStorage)
        const stop = yield* startWorker([])
        // 1 + 2 + 4 + 8 + 16 + 32 ms of waits: seven asks in 70 ms, not one per millisecond
        yield* advance(70, 1)
        assert.strictEqual(h.calls.length, 7)
        yield* stop
      }).pipe(Effect.provide(h.layer))
    })
  )

  it.effect("a backlog (two full claims in a row) stops the waiting; drained, it waits again", () =>
    Effect.gen(function* () {
      const h = yield* harness(() => Effect.succeed("Held"))
      yield* Effect.gen(function* () {
        const storage = yield* QueueStorage
        h.setStorage(storage)
        const ran: Array<number> = []
        const stop = yield* startWorker(ran, 5)
        yield* advance(20, 5)
        assert.deepStrictEqual(h.calls, [`${queue}:Held`], "idle: waiting")
        yield* storage.enqueueMany(
          Array.from({ length: 500 }, (_, n) => ({ kind: "demand_task", queue, args: { n } }))
        )
        yield* advance(75_000, 100) // the poll finds them (60 s ± 20 %: no wake-up in this harness)
        assert.strictEqual(ran.length, 500)
        assert.deepStrictEqual(h.calls, [`${queue}:Held`, `${queue}:stop`, `${queue}:Held`])
        yield* stop
      }).pipe(Effect.provide(h.layer))
    })
  )
})
