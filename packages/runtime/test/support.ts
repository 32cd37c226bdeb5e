/** Helpers shared by the runtime tests. */
import {
  CronStorage,
  FlowStorage,
  KeyGrants,
  LeaderLock,
  QueueStorage,
  SimKeyGrants,
  SimQueueStorage,
  StorageSignals
} from "@awa/storage"
import { Effect, Layer, Logger, Queue, Schedule, Stream, Tracer } from "effect"
import { TestClock } from "effect/testing"
import * as AwaClient from "../src/AwaClient.ts"
import type * as QueueOverrides from "../src/QueueOverrides.ts"

/** A logger layer that keeps the message of every warning, to assert on what was logged. */
export const captureWarnings = () => {
  const warnings: Array<string> = []
  const layer = Logger.layer([
    Logger.make((options) => {
      if (options.logLevel === "Warn") warnings.push(String(options.message))
    })
  ])
  return { warnings, layer }
}

/** A queue's configured settings with no rate limit of either kind, for applying overrides to. */
export const plainQueueBase: QueueOverrides.QueueBase = {
  queue: "plain",
  pollIntervalMs: 200,
  claimBatchSize: undefined,
  deadlineMs: 1000,
  rateLimit: undefined
}

/** Re-runs `check` until it returns true, or fails after `timeoutMs` (real time). */
export const eventually = <E, R>(
  check: Effect.Effect<boolean, E, R>,
  timeoutMs = 20_000,
  label = "condition"
) =>
  check.pipe(
    Effect.flatMap((ok) => (ok ? Effect.void : Effect.fail("not yet" as const))),
    Effect.retry(Schedule.spaced("25 millis")),
    Effect.timeoutOrElse({
      duration: timeoutMs,
      orElse: () => Effect.die(new Error(`${label} did not hold within ${timeoutMs} ms`))
    })
  )

/** A tracer that records every span it creates, like an in-memory exporter. */
export const recordingTracer = () => {
  const spans: Array<Tracer.NativeSpan> = []
  const tracer = Tracer.make({
    span: (options) => {
      const span = new Tracer.NativeSpan(options)
      spans.push(span)
      return span
    }
  })
  return { spans, tracer }
}

/** Moves virtual time forward in small steps, letting every fiber run between steps. */
export const advance = (ms: number, stepMs = 10) =>
  Effect.gen(function* () {
    for (let t = 0; t < ms; t += stepMs) {
      yield* TestClock.adjust(Math.min(stepMs, ms - t))
      for (let i = 0; i < 5; i++) yield* Effect.yieldNow
    }
  })

/**
 * The simulation layer for keyed-dispatch tests: the key-grant service as `wrap` makes it from
 * the simulation's, and storage signals only the test sends (after a first `Subscribed`).
 */
export const keyedSimulation = (wrap: (grants: KeyGrants["Service"]) => KeyGrants["Service"]) =>
  Effect.gen(function* () {
    const signals = yield* Queue.unbounded<StorageSignals.Signal>()
    const grants = Layer.effect(
      KeyGrants,
      Effect.map(KeyGrants, (g) => KeyGrants.of(wrap(g)))
    ).pipe(Layer.provide(SimKeyGrants.layer))
    const driven = Layer.succeed(
      StorageSignals.StorageSignals,
      StorageSignals.StorageSignals.of({
        signals: Stream.concat(
          Stream.succeed<StorageSignals.Signal>({ _tag: "Subscribed" }),
          Stream.fromQueue(signals)
        )
      })
    )
    const layer = AwaClient.layer().pipe(
      Layer.provideMerge(
        Layer.mergeAll(
          CronStorage.layerSim,
          FlowStorage.layerSim,
          LeaderLock.layerMemory,
          grants,
          driven
        ).pipe(Layer.provideMerge(SimQueueStorage.layer))
      )
    )
    return { layer, send: (signal: StorageSignals.Signal) => Queue.offer(signals, signal) }
  })

/**
 * What `Leader.duties` needs: the simulated queue storage with some of its calls replaced
 * (`replace` sees the simulation, to record a call and still make it), and simulated cron storage.
 */
export const leaderStorage = (replace: (sim: QueueStorage["Service"]) => Partial<QueueStorage["Service"]>) =>
  Layer.provideMerge(
    CronStorage.layerSim,
    Layer.effect(
      QueueStorage,
      Effect.map(SimQueueStorage.make, (sim) => QueueStorage.of({ ...sim, ...replace(sim) }))
    )
  )
