/**
 * A claim that fails (an error, not an empty answer) gives back the permits it took from the
 * weighted pool at once, then waits its poll interval (issue 20 leftovers; ADR 0028 decision 2:
 * permits taken before the claim are released in its release step). Before, the wait ran inside
 * the claim's use step: the failing queue held its permits for a whole poll interval.
 */
import { Job } from "@awa/core"
import {
  CallbackStorage,
  CronStorage,
  FlowStorage,
  LeaderLock,
  QueueStorage,
  SimQueueStorage,
  StorageSignals
} from "@awa/storage"
import { assert, describe, it } from "@effect/vitest"
import { Context, Effect, Exit, Fiber, Layer, Schema, Scope } from "effect"
import * as Awa from "../src/Awa.ts"
import * as AwaClientModule from "../src/AwaClient.ts"
import { AwaClient } from "../src/AwaClient.ts"
import * as Callbacks from "../src/Callbacks.ts"
import { handler } from "../src/Handler.ts"
import { Worker } from "../src/Worker.ts"
import { advance } from "./support.ts"

const Broken = Job.define({ kind: "broken_job", args: Schema.Struct({ n: Schema.Number }), queue: "broken" })
const Good = Job.define({ kind: "good_job", args: Schema.Struct({ n: Schema.Number }), queue: "good" })

/** The simulation, with every claim of queue "broken" failing (counted). */
const failing = { claims: 0 }
const simWithBrokenClaims = Layer.effectContext(
  Effect.gen(function* () {
    const storage = yield* QueueStorage
    const callbacks = yield* CallbackStorage
    const claim: typeof storage.claim = (params) =>
      params.queue === "broken"
        ? Effect.suspend(() => {
            failing.claims++
            return Effect.die(new Error("claim failed: connection lost"))
          })
        : storage.claim(params)
    return Context.add(Context.make(QueueStorage, { ...storage, claim }), CallbackStorage, callbacks)
  })
).pipe(Layer.provide(SimQueueStorage.layer))

const sim = Layer.merge(AwaClientModule.layer(), Callbacks.layer).pipe(
  Layer.provideMerge(
    Layer.mergeAll(
      CronStorage.layerSim,
      FlowStorage.layerSim,
      StorageSignals.layerSilent,
      LeaderLock.layerMemory
    ).pipe(Layer.provideMerge(simWithBrokenClaims))
  )
)

describe("a failed claim and the weighted pool (simulation layer, TestClock)", () => {
  it.effect("a failing claim returns its permits at once: the other queue gets the whole pool", () =>
    Effect.gen(function* () {
      const client = yield* AwaClient
      yield* client.insert(Broken, { n: 0 })
      yield* client.insertMany(
        Good,
        Array.from({ length: 40 }, (_, n) => ({ n }))
      )
      let running = 0
      let maxRunning = 0
      const scope = yield* Scope.make()
      const context = yield* Layer.buildWithScope(
        Awa.worker({
          globalMaxWorkers: 4,
          queues: {
            // a long poll: the failed claim waits this long before it tries again
            broken: { pollInterval: "60 seconds", idlePollMax: "10 minutes" },
            good: { pollInterval: "20 millis" }
          },
          handlers: [
            handler(Broken, () => Effect.void),
            handler(Good, () =>
              Effect.acquireUseRelease(
                Effect.sync(() => {
                  running++
                  maxRunning = Math.max(maxRunning, running)
                }),
                () => Effect.sleep(1000),
                () => Effect.sync(() => void running--)
              )
            )
          ],
          maintenance: false
        }),
        scope
      )
      const worker = Context.get(context, Worker)
      yield* advance(3000, 10)
      assert.isAtLeast(failing.claims, 1, "the broken queue's claim failed")
      const snapshot = yield* worker.permits
      const broken = snapshot?.queues.find((q) => q.queue === "broken")
      assert.strictEqual(broken?.held, 0, "the failed claim holds no permit during its wait")
      assert.strictEqual(maxRunning, 4, "the good queue ran on the whole pool")
      // shutdown waits for the handlers still sleeping in virtual time
      const stopping = yield* Effect.forkChild(Scope.close(scope, Exit.void), { startImmediately: true })
      yield* advance(3000, 10)
      yield* Fiber.join(stopping)
    }).pipe(Effect.provide(sim))
  )
})
