/**
 * Progress and checkpoints (capability 14) through the worker, on the simulation layer (virtual
 * time) and on Postgres (real time, short jobs). Every job here is shorter than half a heartbeat
 * interval, so no heartbeat ever carries its progress: what the next attempt sees was written
 * with the outcome, or by `flushProgress`.
 */
import { Job, ProgressTooLarge } from "@awa/core"
import { type JobView, QueueStorage } from "@awa/storage"
import { TestDatabase } from "@awa/testing"
import { assert, describe, it } from "@effect/vitest"
import { Context, Deferred, Effect, Exit, Layer, Schema, Scope } from "effect"
import { TestClock } from "effect/testing"
import * as Awa from "../src/Awa.ts"
import { AwaClient } from "../src/AwaClient.ts"
import { handler } from "../src/Handler.ts"
import type { JobProgress } from "../src/Progress.ts"
import { Worker, type WorkerOptions } from "../src/Worker.ts"
import { eventually } from "./support.ts"

const Step = Job.define({
  kind: "progress_step",
  args: Schema.Struct({ outcome: Schema.Literals(["retry", "snooze", "fail", "cancel", "complete"]) }),
  queue: "progress",
  backoff: () => 0
})

/** Starts a worker in a scope the test closes. */
const startWorker = <R>(options: WorkerOptions<R>) =>
  Effect.gen(function* () {
    const scope = yield* Scope.make()
    const context = yield* Layer.buildWithScope(Awa.worker(options), scope)
    return { worker: Context.get(context, Worker), stop: Scope.close(scope, Exit.void) }
  })

/**
 * Attempt 1 sets progress and metadata, then ends with `outcome` at once; attempt 2 (if any)
 * records what it reads as its checkpoint, adds to the metadata and completes.
 */
const stepHandler = (seen: Array<JobProgress | null>) =>
  handler(Step, ({ outcome }, ctx) =>
    Effect.gen(function* () {
      if (ctx.job.attempt > 1 || ctx.job.progress !== null) {
        seen.push(ctx.job.progress)
        yield* ctx.updateMetadata({ resumed: true })
        return
      }
      yield* ctx.setProgress(40, "halfway there")
      yield* ctx.updateMetadata({ cursor: 7 })
      yield* ctx.updateMetadata({ page: 2 })
      switch (outcome) {
        case "retry":
          return yield* Effect.fail(new Job.JobRetryableError({ message: "transient" }))
        case "snooze":
          return Job.JobResult.snooze(0)
        case "fail":
          return yield* Effect.fail(new Job.JobTerminalError({ message: "gave up" }))
        case "cancel":
          return Job.JobResult.cancel("not needed")
        case "complete":
          return
      }
    })
  )

const checkpoint: JobProgress = { percent: 40, message: "halfway there", metadata: { cursor: 7, page: 2 } }

/** Virtual time, moved in small steps so every fiber runs. */
const advance = (ms: number, stepMs = 10) =>
  Effect.gen(function* () {
    for (let t = 0; t < ms; t += stepMs) {
      yield* TestClock.adjust(Math.min(stepMs, ms - t))
      for (let i = 0; i < 5; i++) yield* Effect.yieldNow
    }
  })

const simMaintenance = {
  electionInterval: "100 millis",
  promoteInterval: "50 millis",
  rescueInterval: "1 second"
} as const

describe("progress on the simulation layer", () => {
  const run = (outcome: "retry" | "snooze" | "fail" | "cancel" | "complete") =>
    Effect.gen(function* () {
      const seen: Array<JobProgress | null> = []
      const { stop } = yield* startWorker({
        queues: { progress: { pollInterval: "50 millis" } },
        handlers: [stepHandler(seen)],
        heartbeatInterval: "30 seconds",
        maintenance: simMaintenance
      })
      const client = yield* AwaClient
      const job = yield* client.insert(Step, { outcome })
      yield* advance(2000, 50)
      const view = yield* client.storage.getJob(job.id)
      yield* stop
      return { seen, view }
    }).pipe(Effect.provide(Awa.layerSim()))

  it.effect("a checkpoint set just before a quick retry is what the next attempt reads", () =>
    Effect.gen(function* () {
      const { seen, view } = yield* run("retry")
      assert.deepStrictEqual(seen, [checkpoint])
      // attempt 2 completed: completion clears the progress
      assert.deepStrictEqual([view.state, view.attempt, view.progress], ["completed", 2, null])
    })
  )

  it.effect("snooze keeps the checkpoint for the next run", () =>
    Effect.gen(function* () {
      const { seen, view } = yield* run("snooze")
      assert.deepStrictEqual(seen, [checkpoint])
      assert.strictEqual(view.state, "completed")
    })
  )

  it.effect("a terminal failure and a cancel keep the checkpoint on the job", () =>
    Effect.gen(function* () {
      for (const outcome of ["fail", "cancel"] as const) {
        const { seen, view } = yield* run(outcome)
        assert.deepStrictEqual(seen, [])
        assert.deepStrictEqual(
          [view.state, view.progress],
          [outcome === "fail" ? "failed" : "cancelled", checkpoint]
        )
      }
    })
  )

  it.effect("completion clears progress", () =>
    Effect.gen(function* () {
      const { view } = yield* run("complete")
      assert.deepStrictEqual([view.state, view.progress], ["completed", null])
    })
  )

  it.effect("setProgress clamps to 0–100, rejects what is not finite, and keeps the metadata", () =>
    Effect.gen(function* () {
      const results: Array<unknown> = []
      const Probe = Job.define({ kind: "progress_probe", args: Schema.Struct({}), queue: "progress" })
      const { stop } = yield* startWorker<QueueStorage>({
        queues: { progress: { pollInterval: "50 millis" } },
        handlers: [
          handler(Probe, (_args, ctx) =>
            Effect.gen(function* () {
              yield* ctx.updateMetadata({ keep: 1 })
              yield* ctx.setProgress(250, "over")
              results.push(yield* ctx.flushProgress.pipe(Effect.andThen(readProgress(ctx.job.id))))
              yield* ctx.setProgress(-3)
              results.push(yield* ctx.flushProgress.pipe(Effect.andThen(readProgress(ctx.job.id))))
              for (const bad of [Number.NaN, Number.POSITIVE_INFINITY])
                results.push((yield* Effect.flip(ctx.setProgress(bad)))._tag)
              results.push((yield* Effect.flip(ctx.setProgress(5, "x".repeat(1001))))._tag)
              results.push((yield* Effect.flip(ctx.updateMetadata([] as never)))._tag)
              results.push((yield* Effect.flip(ctx.updateMetadata({ big: 1n } as never)))._tag)
              return Job.JobResult.cancel("done probing")
            })
          )
        ],
        maintenance: simMaintenance
      })
      const client = yield* AwaClient
      const job = yield* client.insert(Probe, {})
      yield* advance(500, 50)
      yield* stop
      assert.deepStrictEqual(results, [
        { percent: 100, message: "over", metadata: { keep: 1 } },
        { percent: 0, metadata: { keep: 1 } },
        "ValidationError",
        "ValidationError",
        "ValidationError",
        "ValidationError",
        "ValidationError"
      ])
      // the rejected updates changed nothing
      assert.deepStrictEqual((yield* client.storage.getJob(job.id)).progress, {
        percent: 0,
        metadata: { keep: 1 }
      })
    }).pipe(Effect.provide(Awa.layerSim()))
  )

  it.effect("progress over maxProgressBytes is ProgressTooLarge and leaves the last value in place", () =>
    Effect.gen(function* () {
      const errors: Array<unknown> = []
      const Big = Job.define({ kind: "progress_big", args: Schema.Struct({}), queue: "progress" })
      const { stop } = yield* startWorker({
        queues: { progress: { pollInterval: "50 millis" } },
        handlers: [
          handler(Big, (_args, ctx) =>
            Effect.gen(function* () {
              yield* ctx.updateMetadata({ small: "ok" })
              errors.push(yield* Effect.flip(ctx.updateMetadata({ blob: "é".repeat(600) })))
              return Job.JobResult.cancel("stop")
            })
          )
        ],
        maxProgressBytes: 1024,
        maintenance: simMaintenance
      })
      const client = yield* AwaClient
      const job = yield* client.insert(Big, {})
      yield* advance(500, 50)
      yield* stop
      assert.strictEqual(errors.length, 1)
      const error = errors[0] as ProgressTooLarge
      assert.instanceOf(error, ProgressTooLarge)
      assert.deepStrictEqual([error.maxBytes, error.bytes > 1024], [1024, true])
      assert.deepStrictEqual((yield* client.storage.getJob(job.id)).progress, { metadata: { small: "ok" } })
    }).pipe(Effect.provide(Awa.layerSim()))
  )

  it.effect("heartbeats carry progress only when it changed since its last write", () =>
    Effect.gen(function* () {
      const carried: Array<unknown> = []
      // the worker's storage, recording the progress each heartbeat carries
      const Recording = Layer.effect(
        QueueStorage,
        Effect.map(QueueStorage, (s) =>
          QueueStorage.of({
            ...s,
            heartbeatMany: (items) => {
              for (const item of items) if (item.progress !== undefined) carried.push(item.progress)
              return s.heartbeatMany(items)
            }
          })
        )
      )
      const Long = Job.define({ kind: "progress_long", args: Schema.Struct({}), queue: "progress" })
      const scope = yield* Scope.make()
      yield* Layer.buildWithScope(
        Awa.worker({
          queues: { progress: { pollInterval: "50 millis", deadline: 0 } },
          handlers: [
            handler(Long, (_args, ctx) =>
              Effect.gen(function* () {
                yield* ctx.setProgress(10)
                yield* Effect.sleep("10 seconds") // ten heartbeats
                yield* ctx.setProgress(20)
                yield* Effect.sleep("10 seconds")
              })
            )
          ],
          heartbeatInterval: "1 second",
          maintenance: simMaintenance
        }).pipe(Layer.provide(Recording)),
        scope
      )
      const client = yield* AwaClient
      const job = yield* client.insert(Long, {})
      yield* advance(25_000, 100)
      yield* Scope.close(scope, Exit.void)
      assert.deepStrictEqual(carried, [{ percent: 10 }, { percent: 20 }])
      assert.deepStrictEqual((yield* client.storage.getJob(job.id)).state, "completed")
    }).pipe(Effect.provide(Awa.layerSim()))
  )

  it.effect("maxProgressBytes outside 1 KiB – 1 MiB is a configuration error", () =>
    Effect.gen(function* () {
      for (const maxProgressBytes of [1023, 1_048_577, 2.5]) {
        const exit = yield* Effect.exit(
          startWorker<never>({ queues: { progress: {} }, handlers: [], maxProgressBytes, maintenance: false })
        )
        assert.isTrue(Exit.isFailure(exit))
        assert.include(String(Exit.isFailure(exit) && exit.cause), "maxProgressBytes")
      }
    }).pipe(Effect.provide(Awa.layerSim()))
  )
})

const readProgress = (id: bigint) =>
  Effect.map(
    Effect.flatMap(QueueStorage, (s) => s.getJob(id)),
    (view: JobView) => view.progress
  ).pipe(Effect.orDie)

describe("progress on Postgres", () => {
  const AwaLive = Awa.layerPg().pipe(Layer.provideMerge(TestDatabase.layer({ maxConnections: 8 })))
  const pgMaintenance = {
    electionInterval: "50 millis",
    promoteInterval: "20 millis",
    rescueInterval: "100 millis"
  } as const

  it.live("each outcome writes the checkpoint in its own statement; the next attempt reads it", () =>
    Effect.gen(function* () {
      const seen: Array<JobProgress | null> = []
      const { stop } = yield* startWorker({
        queues: { progress: { pollInterval: "50 millis" } },
        handlers: [stepHandler(seen)],
        heartbeatInterval: "30 seconds",
        maintenance: pgMaintenance
      })
      const client = yield* AwaClient
      const ids = yield* Effect.forEach(
        ["retry", "snooze", "fail", "cancel", "complete"] as const,
        (outcome) => Effect.map(client.insert(Step, { outcome }), (j) => j.id)
      )
      const states = () => Effect.forEach(ids, (id) => client.storage.getJob(id))
      yield* eventually(
        Effect.map(states(), (views) =>
          views.every(
            (v) =>
              v.state !== "running" &&
              v.state !== "available" &&
              v.state !== "retryable" &&
              v.state !== "scheduled"
          )
        )
      )
      const views = yield* states()
      yield* stop
      assert.deepStrictEqual(seen, [checkpoint, checkpoint])
      assert.deepStrictEqual(
        views.map((v) => [v.state, v.progress]),
        [
          ["completed", null],
          ["completed", null],
          ["failed", checkpoint],
          ["cancelled", checkpoint],
          ["completed", null]
        ]
      )
    }).pipe(Effect.provide(AwaLive))
  )

  it.live("flushProgress writes at once; after the attempt is closed elsewhere it is a no-op", () =>
    Effect.gen(function* () {
      const Held = Job.define({ kind: "progress_held", args: Schema.Struct({}), queue: "progress" })
      const flushed = yield* Deferred.make<void>()
      const release = yield* Deferred.make<void>()
      const late = yield* Deferred.make<Exit.Exit<void, unknown>>()
      const { stop } = yield* startWorker({
        queues: { progress: { pollInterval: "50 millis" } },
        handlers: [
          handler(Held, (_args, ctx) =>
            Effect.gen(function* () {
              yield* ctx.setProgress(10, "started")
              yield* ctx.flushProgress
              yield* Deferred.succeed(flushed, undefined)
              // cancelled from outside while waiting here; the handler ignores interruption
              yield* Effect.uninterruptible(
                Effect.gen(function* () {
                  yield* Deferred.await(release)
                  yield* ctx.setProgress(90, "too late")
                  yield* Deferred.succeed(late, yield* Effect.exit(ctx.flushProgress))
                })
              )
            })
          )
        ],
        heartbeatInterval: "30 seconds",
        maintenance: pgMaintenance
      })
      const client = yield* AwaClient
      const job = yield* client.insert(Held, {})
      yield* Deferred.await(flushed)
      assert.deepStrictEqual((yield* client.storage.getJob(job.id)).progress, {
        percent: 10,
        message: "started"
      })
      yield* client.storage.cancelJob(job.id, "operator")
      yield* Deferred.succeed(release, undefined)
      const exit = yield* Deferred.await(late)
      yield* stop
      assert.isTrue(Exit.isSuccess(exit), "a flush for a closed attempt succeeds")
      const view = yield* client.storage.getJob(job.id)
      assert.deepStrictEqual([view.state, view.progress], ["cancelled", { percent: 10, message: "started" }])
    }).pipe(Effect.provide(AwaLive))
  )
})
