/**
 * The whole runtime on the deterministic simulation layer, with virtual time (`TestClock`):
 * timings here are exact, not "eventually".
 */
import { Backoff, Job } from "@awa/core"
import { QueueStorage } from "@awa/storage"
import { assert, describe, it } from "@effect/vitest"
import {
  Clock,
  Context,
  Deferred,
  type Duration,
  Effect,
  Exit,
  Fiber,
  Layer,
  Random,
  Schema,
  Scope
} from "effect"
import * as Awa from "../src/Awa.ts"
import { AwaClient } from "../src/AwaClient.ts"
import { handler } from "../src/Handler.ts"
import { Worker, type WorkerOptions } from "../src/Worker.ts"
import { advance } from "./support.ts"

const Task = Job.define({ kind: "task", args: Schema.Struct({ n: Schema.Number }), queue: "sim" })

const maintenance = {
  electionInterval: "100 millis",
  promoteInterval: "100 millis",
  rescueInterval: "1 second"
} as const

/** Starts a worker on the simulation layer; returns its service and how to stop it. */
const startWorkerService = <R>(options: WorkerOptions<R>) =>
  Effect.gen(function* () {
    const scope = yield* Scope.make()
    const context = yield* Layer.buildWithScope(Awa.worker(options), scope)
    yield* advance(50)
    return { worker: Context.get(context, Worker), stop: Scope.close(scope, Exit.void) }
  })

/** Starts a worker on the simulation layer in a scope the test closes. */
const startWorker = <R>(options: WorkerOptions<R>) =>
  Effect.map(startWorkerService(options), ({ stop }) => stop)

const SimLive = Awa.layerSim()

describe("Worker on the simulation layer", () => {
  it.effect("retries follow the default backoff: 2^attempt s plus at most 25 % jitter", () =>
    Effect.gen(function* () {
      const starts: Array<number> = []
      const stop = yield* startWorker({
        queues: { sim: { pollInterval: "50 millis" } },
        handlers: [
          handler(Task, () =>
            Effect.gen(function* () {
              starts.push(yield* Clock.currentTimeMillis)
              return yield* Effect.fail(new Job.JobRetryableError({ message: "always" }))
            })
          )
        ],
        maintenance
      })
      const client = yield* AwaClient
      const job = yield* client.insert(Task, { n: 1 }, { maxAttempts: 4 })
      yield* advance(30_000, 50)
      assert.strictEqual(starts.length, 4)
      const view = yield* client.storage.getJob(job.id)
      assert.strictEqual(view.state, "failed")
      // gap after attempt a: backoff(a) plus at most one promote interval and one poll interval
      for (let a = 1; a < 4; a++) {
        const gap = starts[a]! - starts[a - 1]!
        const { min, max } = Backoff.backoffBounds(a)
        assert.isAtLeast(gap, min, `gap after attempt ${a}`)
        assert.isAtMost(gap, max + 100 + 50 + 20, `gap after attempt ${a}`)
      }
      yield* stop
    }).pipe(Effect.provide(SimLive), Random.withSeed(7))
  )

  it.effect("a snoozed job runs again after its delay and keeps its attempt number", () =>
    Effect.gen(function* () {
      const starts: Array<{ at: number; attempt: number }> = []
      const stop = yield* startWorker({
        queues: { sim: { pollInterval: "50 millis" } },
        handlers: [
          handler(Task, (_args, ctx) =>
            Effect.gen(function* () {
              starts.push({ at: yield* Clock.currentTimeMillis, attempt: ctx.job.attempt })
              return starts.length === 1 ? Job.JobResult.snooze("5 seconds") : Job.JobResult.completed
            })
          )
        ],
        maintenance
      })
      const client = yield* AwaClient
      const job = yield* client.insert(Task, { n: 1 })
      yield* advance(4_900, 50)
      assert.strictEqual(starts.length, 1, "not before the snooze ends")
      yield* advance(400, 50)
      assert.strictEqual(starts.length, 2)
      assert.deepStrictEqual(
        starts.map((s) => s.attempt),
        [1, 1]
      )
      assert.strictEqual((yield* client.storage.getJob(job.id)).state, "completed")
      yield* stop
    }).pipe(Effect.provide(SimLive))
  )

  it.effect("a handler past its deadline is interrupted at the deadline, not before", () =>
    Effect.gen(function* () {
      let interruptedAt: number | undefined
      const stop = yield* startWorker({
        queues: { sim: { deadline: "2 seconds", pollInterval: "50 millis" } },
        handlers: [
          handler(Task, () =>
            Effect.never.pipe(
              Effect.onInterrupt(() =>
                Effect.flatMap(Clock.currentTimeMillis, (now) =>
                  Effect.sync(() => {
                    interruptedAt = now
                  })
                )
              )
            )
          )
        ],
        maintenance
      })
      const client = yield* AwaClient
      const start = yield* Clock.currentTimeMillis
      const job = yield* client.insert(Task, { n: 1 }, { maxAttempts: 1 })
      yield* advance(1_900, 50)
      assert.isUndefined(interruptedAt)
      yield* advance(300, 50)
      assert.isDefined(interruptedAt)
      assert.isAtLeast(interruptedAt! - start, 2000)
      assert.isAtMost(interruptedAt! - start, 2000 + 100)
      const view = yield* client.storage.getJob(job.id)
      assert.deepStrictEqual([view.state, view.errors.at(-1)!.error], ["failed", "hard deadline exceeded"])
      yield* stop
    }).pipe(Effect.provide(SimLive))
  )

  it.effect("an attempt of a dead worker is rescued once its heartbeat is stale, not earlier", () =>
    Effect.gen(function* () {
      const client = yield* AwaClient
      const storage = yield* QueueStorage
      const job = yield* client.insert(Task, { n: 1 })
      yield* storage.claim({ queue: "sim", max: 1, deadlineMs: 0, agingIntervalMs: 0 }) // the worker that dies
      const ran: Array<number> = []
      const stop = yield* startWorker({
        queues: { sim: { pollInterval: "100 millis" } },
        handlers: [
          handler(Job.define({ ...Task, backoff: () => 0 }), ({ n }) => Effect.sync(() => void ran.push(n)))
        ],
        heartbeatInterval: "30 seconds",
        heartbeatStaleness: "90 seconds",
        maintenance: { ...maintenance, rescueInterval: "30 seconds" }
      })
      yield* advance(85_000, 500)
      assert.strictEqual((yield* storage.getJob(job.id)).state, "running", "not rescued before the staleness")
      yield* advance(40_000, 500)
      const view = yield* storage.getJob(job.id)
      assert.deepStrictEqual([view.state, view.attempt], ["completed", 2])
      assert.deepStrictEqual(ran, [1])
      yield* stop
    }).pipe(Effect.provide(SimLive))
  )

  it.effect("a long handler that heartbeats is never rescued", () =>
    Effect.gen(function* () {
      const stop = yield* startWorker({
        queues: { sim: { pollInterval: "100 millis", deadline: 0 } },
        handlers: [handler(Task, () => Effect.sleep("10 minutes"))],
        heartbeatInterval: "30 seconds",
        heartbeatStaleness: "90 seconds",
        maintenance: { ...maintenance, rescueInterval: "30 seconds" }
      })
      const client = yield* AwaClient
      const job = yield* client.insert(Task, { n: 1 })
      yield* advance(11 * 60_000, 1000)
      const view = yield* client.storage.getJob(job.id)
      assert.deepStrictEqual([view.state, view.attempt, view.errors.length], ["completed", 1, 0])
      yield* stop
    }).pipe(Effect.provide(SimLive))
  )

  it.effect("progress set by the handler is written with the heartbeat and kept for the next attempt", () =>
    Effect.gen(function* () {
      const seen: Array<unknown> = []
      const stop = yield* startWorker({
        queues: { sim: { pollInterval: "100 millis", deadline: 0 } },
        handlers: [
          handler(Job.define({ ...Task, backoff: () => 0 }), (_args, ctx) =>
            Effect.gen(function* () {
              if (ctx.job.attempt === 1) {
                yield* ctx.updateMetadata({ step: 3 })
                yield* Effect.sleep("45 seconds")
                return yield* Effect.fail(new Job.JobRetryableError({ message: "crash after step 3" }))
              }
              seen.push((yield* (yield* AwaClient).storage.getJob(ctx.job.id)).progress, ctx.job.progress)
            })
          )
        ],
        heartbeatInterval: "30 seconds",
        maintenance
      })
      const client = yield* AwaClient
      yield* client.insert(Task, { n: 1 })
      yield* advance(60_000, 500)
      assert.deepStrictEqual(seen, [{ metadata: { step: 3 } }, { metadata: { step: 3 } }])
      yield* stop
    }).pipe(Effect.provide(SimLive))
  )

  describe("claiming ahead of free capacity", () => {
    /**
     * A worker with one slot whose dispatcher has measured some throughput: one quick job first,
     * so the next claim takes a job beyond the free slot. Then a blocker and a victim are
     * enqueued together: the blocker runs, the victim waits in the buffer.
     */
    const blockerAndVictim = (
      options: Omit<Partial<WorkerOptions<never>>, "queues"> & { readonly deadline?: Duration.Input }
    ) =>
      Effect.gen(function* () {
        const ran: Array<number> = []
        const gate = yield* Deferred.make<void>()
        const { worker, stop } = yield* startWorkerService({
          queues: {
            sim: {
              maxConcurrency: 1,
              prefetch: 8,
              pollInterval: "50 millis",
              deadline: options.deadline ?? 0
            }
          },
          handlers: [
            handler(Job.define({ ...Task, backoff: () => 60_000 }), ({ n }) =>
              Effect.gen(function* () {
                ran.push(n)
                if (n === 1) yield* Deferred.await(gate)
              })
            )
          ],
          maintenance,
          ...options
        })
        const client = yield* AwaClient
        yield* client.insert(Task, { n: 0 })
        yield* advance(200)
        const [blocker, victim] = yield* client.insertMany(Task, [{ n: 1 }, { n: 2 }])
        yield* advance(60)
        assert.deepStrictEqual(ran, [0, 1], "the blocker runs")
        assert.strictEqual(yield* worker.running, 2, "the victim is held, waiting")
        return { ran, gate, stop, worker, client, blocker: blocker!, victim: victim! }
      })

    it.effect("never runs more than maxConcurrency handlers, and starts jobs in lane order", () =>
      Effect.gen(function* () {
        const starts: Array<number> = []
        let running = 0
        let most = 0
        const stop = yield* startWorker({
          queues: { sim: { maxConcurrency: 3, prefetch: 50, pollInterval: "50 millis" } },
          handlers: [
            handler(Task, ({ n }) =>
              Effect.gen(function* () {
                starts.push(n)
                most = Math.max(most, ++running)
                yield* Effect.sleep(10 + (n % 4) * 10)
                running--
              })
            )
          ],
          maintenance
        })
        const client = yield* AwaClient
        yield* client.insertMany(
          Task,
          Array.from({ length: 40 }, (_, n) => ({ n }))
        )
        yield* advance(2_000, 5)
        assert.deepStrictEqual(
          starts,
          Array.from({ length: 40 }, (_, n) => n)
        )
        assert.strictEqual(most, 3)
        yield* stop
      }).pipe(Effect.provide(SimLive))
    )

    it.effect("a job cancelled while it waits in the buffer never runs", () =>
      Effect.gen(function* () {
        const { ran, gate, stop, worker, client, victim } = yield* blockerAndVictim({
          heartbeatInterval: "1 second"
        })
        yield* client.storage.cancelJob(victim.id, "no longer wanted")
        // the next heartbeat covers held attempts and learns the victim's attempt was closed
        yield* advance(1_500)
        yield* Deferred.succeed(gate, undefined)
        yield* advance(500)
        assert.deepStrictEqual(ran, [0, 1])
        assert.strictEqual((yield* client.storage.getJob(victim.id)).state, "cancelled")
        assert.strictEqual(yield* worker.running, 0)
        yield* stop
      }).pipe(Effect.provide(SimLive))
    )

    it.effect("a job whose deadline passes while it waits is retried without running", () =>
      Effect.gen(function* () {
        const { ran, stop, client, blocker, victim } = yield* blockerAndVictim({ deadline: "1 second" })
        yield* advance(1_200)
        assert.deepStrictEqual(ran, [0, 1], "the victim never started")
        for (const id of [blocker.id, victim.id]) {
          const view = yield* client.storage.getJob(id)
          assert.deepStrictEqual(
            [view.state, view.errors.at(-1)?.error],
            ["retryable", "hard deadline exceeded"]
          )
        }
        yield* stop
      }).pipe(Effect.provide(SimLive))
    )

    it.effect("jobs still waiting at shutdown are given back with their attempt number and run later", () =>
      Effect.gen(function* () {
        const { ran, stop, client, blocker, victim } = yield* blockerAndVictim({
          shutdownTimeout: "100 millis"
        })
        // shutdown waits 100 ms (virtual) for the blocker, then interrupts it
        const stopping = yield* Effect.forkChild(stop)
        yield* advance(300)
        yield* Fiber.join(stopping)
        const interrupted = yield* client.storage.getJob(blocker.id)
        assert.deepStrictEqual(
          [interrupted.state, interrupted.errors.at(-1)?.error],
          ["retryable", "interrupted: worker shutting down"]
        )
        const given = yield* client.storage.getJob(victim.id)
        assert.deepStrictEqual([given.state, given.attempt, given.errors.length], ["scheduled", 0, 0])
        assert.deepStrictEqual(ran, [0, 1])
        const again = yield* startWorker({
          queues: { sim: { pollInterval: "50 millis" } },
          handlers: [handler(Task, ({ n }) => Effect.sync(() => void ran.push(n)))],
          maintenance
        })
        yield* advance(1_000)
        const view = yield* client.storage.getJob(victim.id)
        assert.deepStrictEqual([view.state, view.attempt], ["completed", 1])
        assert.strictEqual(ran.filter((n) => n === 2).length, 1)
        yield* again
      }).pipe(Effect.provide(SimLive))
    )
  })
})
