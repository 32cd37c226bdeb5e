/**
 * The worker's side of per-key execution control (capabilities.md §23) on the simulation layer
 * with virtual time: a queue bound to a key policy never runs more than `maxInFlight` jobs of a
 * key, a gated queue is busy (its jobs run as soon as grants close, not after an idle backoff),
 * tier 1 bounds a key per process, and the metrics move.
 */
import { Job } from "@awa/core"
import {
  CronStorage,
  FlowStorage,
  KeyGrants,
  LeaderLock,
  SimKeyGrants,
  SimQueueStorage,
  StorageSignals
} from "@awa/storage"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Exit, Layer, Metric, Schema, Scope, Stream } from "effect"
import * as Awa from "../src/Awa.ts"
import * as AwaClientModule from "../src/AwaClient.ts"
import { AwaClient } from "../src/AwaClient.ts"
import { handler } from "../src/Handler.ts"
import * as KeyGrantMetrics from "../src/KeyGrantMetrics.ts"
import { advance } from "./support.ts"

const Task = Job.define({ kind: "ktask", args: Schema.Struct({ key: Schema.String }), queue: "keyed" })
/** The same jobs, each keyed by its args (the definition's `concurrencyKey`). */
const KeyedTask = Job.define({
  kind: "ktask",
  args: Schema.Struct({ key: Schema.String }),
  queue: "keyed",
  concurrencyKey: ({ key }) => (key === "none" ? undefined : key)
})

/**
 * The simulation with a listener that is subscribed (and stays silent): idle polls back off, as
 * in production, so a gated queue counted as idle would wait for its backed-off poll.
 */
const listeningSim = AwaClientModule.layer().pipe(
  Layer.provideMerge(
    Layer.mergeAll(
      CronStorage.layerSim,
      FlowStorage.layerSim,
      LeaderLock.layerMemory,
      SimKeyGrants.layer,
      Layer.succeed(
        StorageSignals.StorageSignals,
        StorageSignals.StorageSignals.of({
          signals: Stream.concat(Stream.succeed<StorageSignals.Signal>({ _tag: "Subscribed" }), Stream.never)
        })
      )
    ).pipe(Layer.provideMerge(SimQueueStorage.layer))
  )
)

const ownRegistry = <A, E, R>(effect: Effect.Effect<A, E, R>) =>
  Effect.provideService(effect, Metric.MetricRegistry, new Map())

/** A handler that takes `ms` and records the most of one key running at once. */
const tracking = (ms = 100) => {
  const running = new Map<string, number>()
  const peak = new Map<string, number>()
  let done = 0
  const h = handler(Task, ({ key }) =>
    Effect.gen(function* () {
      const n = (running.get(key) ?? 0) + 1
      running.set(key, n)
      peak.set(key, Math.max(peak.get(key) ?? 0, n))
      yield* Effect.sleep(ms)
      running.set(key, running.get(key)! - 1)
      done++
    })
  )
  return { h, peak, done: () => done }
}

describe("key grants in the worker", () => {
  it.effect("keyPolicy: at most maxInFlight per key, gated is busy, metrics move", () =>
    Effect.gen(function* () {
      const grants = yield* KeyGrants
      yield* grants.create({ id: "tenants", maxInFlight: 2 })
      const t = tracking(1000)
      const scope = yield* Scope.make()
      yield* Layer.buildWithScope(
        Awa.worker({
          // a long idle poll: a gated queue must not wait for it
          queues: {
            keyed: {
              maxConcurrency: 20,
              keyPolicy: "tenants",
              pollInterval: "50 millis",
              idlePollMax: "10 minutes"
            }
          },
          handlers: [t.h],
          maintenance: false
        }),
        scope
      )
      const client = yield* AwaClient
      for (let i = 0; i < 8; i++) yield* client.insert(Task, { key: "hot" }, { concurrencyKey: "hot" })
      // 8 jobs of one key, 2 at a time, 1 s each: four rounds, each claimed within a poll (50 ms) of
      // the previous round's end. Counted as idle, the gated claims of a round would back the
      // poll off (100, 200, 400, 800 ms): each round would start ~0.5 s late.
      yield* advance(4_600, 10)
      assert.strictEqual(t.done(), 8)
      assert.strictEqual(t.peak.get("hot"), 2)
      const gated = yield* Metric.value(
        KeyGrantMetrics.keyClaimsBusy.pipe(Metric.withAttributes({ "awa.queue": "keyed", outcome: "gated" }))
      )
      assert.isAbove(gated.count, 0)
      yield* KeyGrantMetrics.collect
      const open = yield* Metric.value(
        KeyGrantMetrics.openGrants.pipe(Metric.withAttributes({ "awa.key_policy": "tenants" }))
      )
      assert.strictEqual(open.value, 0)
      yield* Scope.close(scope, Exit.void)
    }).pipe(Effect.provide(listeningSim), ownRegistry)
  )

  it.effect("a definition's concurrencyKey keys each job of one insertMany by its args", () =>
    Effect.gen(function* () {
      const grants = yield* KeyGrants
      yield* grants.create({ id: "tenants", maxInFlight: 1 })
      const t = tracking(1000)
      const scope = yield* Scope.make()
      yield* Layer.buildWithScope(
        Awa.worker({
          queues: { keyed: { maxConcurrency: 20, keyPolicy: "tenants", pollInterval: "50 millis" } },
          handlers: [t.h],
          maintenance: false
        }),
        scope
      )
      const client = yield* AwaClient
      yield* client.insertMany(
        KeyedTask,
        Array.from({ length: 6 }, (_, i) => ({ key: `k${i % 2}` }))
      )
      // two keys, one in flight each, 1 s a job: three rounds. One key for the whole batch would
      // take six; no key would run all six at once.
      yield* advance(3_300, 10)
      assert.strictEqual(t.done(), 6)
      assert.strictEqual(t.peak.get("k0"), 1)
      assert.strictEqual(t.peak.get("k1"), 1)
      yield* Scope.close(scope, Exit.void)
    }).pipe(Effect.provide(listeningSim), ownRegistry)
  )

  it.effect(
    "an insert's own concurrencyKey wins; undefined means none; a throwing function is a ValidationError",
    () =>
      Effect.gen(function* () {
        const client = yield* AwaClient
        const keyOf = (id: bigint) =>
          Effect.map(client.storage.listJobs({ queue: "keyed" }), (jobs) => {
            const job = jobs.find((j) => j.id === id)
            return job?.metadata["awa:concurrencyKey"]
          })
        const own = yield* client.insert(KeyedTask, { key: "k1" }, { concurrencyKey: "mine" })
        const none = yield* client.insert(KeyedTask, { key: "none" })
        const derived = yield* client.insert(KeyedTask, { key: "k2" })
        assert.strictEqual(yield* keyOf(own!.id), "mine")
        assert.strictEqual(yield* keyOf(none!.id), undefined)
        assert.strictEqual(yield* keyOf(derived!.id), "k2")

        const Throwing = Job.define({
          kind: "ktask",
          args: Schema.Struct({ key: Schema.String }),
          queue: "keyed",
          concurrencyKey: ({ key }) => {
            if (key === "bad") throw new Error("no tenant")
            return key
          }
        })
        const before = (yield* client.storage.listJobs({ queue: "keyed" })).length
        const failed = yield* Effect.flip(client.insertMany(Throwing, [{ key: "ok" }, { key: "bad" }]))
        assert.strictEqual(failed._tag, "ValidationError")
        assert.include(String((failed as { reason?: string }).reason), "no tenant")
        assert.strictEqual(
          (yield* client.storage.listJobs({ queue: "keyed" })).length,
          before,
          "nothing written"
        )
        // a key the storage refuses (empty) fails the whole batch the same way
        const empty = yield* Effect.flip(client.insertMany(Throwing, [{ key: "ok" }, { key: "" }]))
        assert.strictEqual(empty._tag, "ValidationError")
        assert.strictEqual(
          (yield* client.storage.listJobs({ queue: "keyed" })).length,
          before,
          "nothing written"
        )
      }).pipe(Effect.provide(Awa.layerSim()))
  )

  it.effect("a keyPolicy nobody created fails the worker's start", () =>
    Effect.gen(function* () {
      const exit = yield* Effect.exit(
        Layer.build(
          Awa.worker({
            queues: { keyed: { keyPolicy: "missing" } },
            handlers: [tracking().h],
            maintenance: false
          })
        ).pipe(Effect.scoped)
      )
      assert.isTrue(Exit.isFailure(exit))
      assert.include(String(exit), "AwaConfigError")
    }).pipe(Effect.provide(Awa.layerSim()))
  )

  it.effect("localKeyConcurrency: at most limit per key in this process", () =>
    Effect.gen(function* () {
      const t = tracking()
      const scope = yield* Scope.make()
      yield* Layer.buildWithScope(
        Awa.worker({
          queues: {
            keyed: { maxConcurrency: 10, localKeyConcurrency: { limit: 1 }, pollInterval: "50 millis" }
          },
          handlers: [t.h],
          maintenance: false
        }),
        scope
      )
      const client = yield* AwaClient
      for (let i = 0; i < 6; i++)
        yield* client.insert(Task, { key: `k${i % 2}` }, { concurrencyKey: `k${i % 2}` })
      yield* advance(1_000, 10)
      assert.strictEqual(t.done(), 6)
      assert.strictEqual(t.peak.get("k0"), 1)
      assert.strictEqual(t.peak.get("k1"), 1)
      yield* Scope.close(scope, Exit.void)
    }).pipe(Effect.provide(Awa.layerSim()))
  )
})
