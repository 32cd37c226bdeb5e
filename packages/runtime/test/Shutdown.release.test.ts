/**
 * A deploy does not fail jobs (capabilities.md §7, "Shutdown"): an attempt cut off by the
 * worker's shutdown is released, runnable again at once with the attempt not counted, so a job
 * on its last attempt survives a rolling deploy. On the Sim (virtual time) and on Postgres.
 */
import { Job } from "@awa/core"
import { TestDatabase } from "@awa/testing"
import { PgClient } from "@effect/sql-pg"
import { assert, describe, it } from "@effect/vitest"
import { Context, Deferred, Effect, Exit, Fiber, Layer, Redacted, Schema, Scope } from "effect"
import { TestClock } from "effect/testing"
import * as Awa from "../src/Awa.ts"
import { AwaClient } from "../src/AwaClient.ts"
import { handler } from "../src/Handler.ts"
import { Worker, type WorkerOptions } from "../src/Worker.ts"
import { eventually } from "./support.ts"

const Deploy = Job.define({
  kind: "deploy_victim",
  args: Schema.Struct({ n: Schema.Number }),
  queue: "deploy"
})

const advance = (ms: number, stepMs = 10) =>
  Effect.gen(function* () {
    for (let t = 0; t < ms; t += stepMs) {
      yield* TestClock.adjust(Math.min(stepMs, ms - t))
      for (let i = 0; i < 5; i++) yield* Effect.yieldNow
    }
  })

/** Builds a worker in a scope the test closes, on the ambient Awa services. */
const startWorker = <R>(options: WorkerOptions<R>) =>
  Effect.gen(function* () {
    // closed by the test's scope too, so a failing test does not leave the worker running
    const scope = yield* Effect.acquireRelease(Scope.make(), (s) => Scope.close(s, Exit.void))
    const context = yield* Layer.buildWithScope(Awa.worker(options), scope)
    return { worker: Context.get(context, Worker), stop: Scope.close(scope, Exit.void) }
  })

/** Old version: a handler that never finishes; the job has one attempt. New version: completes. */
const versions = Effect.gen(function* () {
  const started = yield* Deferred.make<void>()
  const ran: Array<number> = []
  const old: WorkerOptions<never> = {
    queues: { deploy: { pollInterval: "50 millis" } },
    handlers: [handler(Deploy, () => Effect.andThen(Deferred.succeed(started, undefined), Effect.never))],
    shutdownTimeout: "100 millis",
    maintenance: { electionInterval: "100 millis", promoteInterval: "50 millis" }
  }
  const next: WorkerOptions<never> = {
    ...old,
    handlers: [handler(Deploy, ({ n }) => Effect.sync(() => void ran.push(n)))]
  }
  return { started, ran, old, next }
})

describe("shutdown releases the attempts it cuts off", () => {
  it.effect("on the simulation: a job on its last attempt runs again on the next version and completes", () =>
    Effect.gen(function* () {
      const { started, ran, old, next } = yield* versions
      const client = yield* AwaClient
      const a = yield* startWorker(old)
      yield* advance(50)
      const job = yield* client.insert(Deploy, { n: 1 }, { maxAttempts: 1 })
      yield* advance(200)
      assert.isTrue(yield* Deferred.isDone(started), "the old version is running it")
      const stopping = yield* Effect.forkChild(a.stop)
      yield* advance(300)
      yield* Fiber.join(stopping)
      const cut = yield* client.storage.getJob(job.id)
      assert.deepStrictEqual(
        [cut.state, cut.attempt, cut.errors.map((e) => [e.error, e.terminal])],
        ["retryable", 0, [["interrupted: worker shutting down", undefined]]]
      )
      const b = yield* startWorker(next)
      yield* advance(500)
      const done = yield* client.storage.getJob(job.id)
      assert.deepStrictEqual([done.state, done.attempt, ran], ["completed", 1, [1]])
      yield* b.stop
    }).pipe(Effect.provide(Awa.layerSim()))
  )

  it.live(
    "on Postgres: a job on its last attempt survives a rolling deploy",
    () =>
      Effect.flatMap(TestDatabase.acquire(), ({ url }) => {
        const awa = Awa.layerPg().pipe(
          Layer.provideMerge(PgClient.layer({ url: Redacted.make(url), maxConnections: 6 }))
        )
        return Effect.gen(function* () {
          const { started, ran, old, next } = yield* versions
          const client = yield* AwaClient
          const a = yield* startWorker(old)
          const job = yield* client.insert(Deploy, { n: 1 }, { maxAttempts: 1 })
          yield* Deferred.await(started)
          yield* a.stop
          const cut = yield* client.storage.getJob(job.id)
          assert.deepStrictEqual(
            [cut.state, cut.attempt, cut.errors.map((e) => [e.error, e.terminal])],
            ["retryable", 0, [["interrupted: worker shutting down", undefined]]]
          )
          const b = yield* startWorker(next)
          yield* eventually(
            Effect.map(client.storage.getJob(job.id), (v) => v.state === "completed"),
            30_000,
            "the new version completed it"
          )
          const done = yield* client.storage.getJob(job.id)
          assert.deepStrictEqual([done.attempt, ran], [1, [1]])
          yield* b.stop
        }).pipe(Effect.provide(awa))
      }),
    60_000
  )
})
