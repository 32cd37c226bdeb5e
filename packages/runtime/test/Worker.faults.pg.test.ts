/**
 * The worker under adversity, on real Postgres: several workers on separate pools, leader loss,
 * a killed LISTEN connection, remote cancel, deadlines, dead workers and long handlers.
 */
import { Job } from "@awa/core"
import { QueueStorage } from "@awa/storage"
import { TestDatabase } from "@awa/testing"
import { PgClient } from "@effect/sql-pg"
import { assert, describe, it } from "@effect/vitest"
import { Context, Effect, Exit, Layer, Redacted, Schema, Scope, SubscriptionRef } from "effect"
import { SqlClient } from "effect/sql"
import * as Awa from "../src/Awa.ts"
import { AwaClient } from "../src/AwaClient.ts"
import { handler } from "../src/Handler.ts"
import { Worker, type WorkerOptions } from "../src/Worker.ts"
import { eventually } from "./support.ts"

const Count = Job.define({ kind: "count", args: Schema.Struct({ n: Schema.Number }), queue: "faults" })
const Hang = Job.define({ kind: "hang", args: Schema.Struct({ n: Schema.Number }), queue: "faults" })
const Slow = Job.define({ kind: "slow", args: Schema.Struct({ ms: Schema.Number }), queue: "faults" })

const fast = {
  electionInterval: "100 millis",
  promoteInterval: "20 millis",
  rescueInterval: "100 millis",
  rotateInterval: "200 millis"
} as const

/** Awa on its own pool against `url`. */
const awaOn = (url: string, maxConnections = 6) =>
  Awa.layerPg().pipe(Layer.provideMerge(PgClient.layer({ url: Redacted.make(url), maxConnections })))

/** Builds a worker (with its own pool) in a scope the test controls. */
const startWorker = <R>(url: string, options: WorkerOptions<R>) =>
  Effect.gen(function* () {
    const scope = yield* Scope.make()
    const context = yield* Layer.buildWithScope(
      Awa.worker(options).pipe(Layer.provideMerge(awaOn(url))),
      scope
    )
    return { scope, worker: Context.get(context, Worker), stop: Scope.close(scope, Exit.void) }
  })

const withDatabase = <A, E, R>(body: (url: string) => Effect.Effect<A, E, R>) =>
  Effect.flatMap(TestDatabase.acquire(), ({ url }) => body(url))

describe("Worker faults on Postgres", () => {
  it.live(
    "two workers on separate pools run 10,000 jobs exactly once between them",
    () =>
      withDatabase((url) =>
        Effect.gen(function* () {
          const runs = new Map<number, number>()
          const options: WorkerOptions<never> = {
            queues: { faults: { maxConcurrency: 40 } },
            handlers: [
              handler(Count, ({ n }) => Effect.sync(() => void runs.set(n, (runs.get(n) ?? 0) + 1)))
            ],
            maintenance: fast
          }
          const a = yield* startWorker(url, options)
          const b = yield* startWorker(url, options)
          const client = yield* AwaClient
          const total = 10_000
          for (let i = 0; i < total; i += 1000) {
            yield* client.insertMany(
              Count,
              Array.from({ length: 1000 }, (_, k) => ({ n: i + k }))
            )
          }
          // a bound on liveness, not a margin: on a loaded 2-core machine the drain took over 60 s
          yield* eventually(
            Effect.sync(() => runs.size === total),
            240_000,
            "all 10,000 ran"
          )
          yield* Effect.all([a.stop, b.stop])
          assert.strictEqual(runs.size, total)
          assert.deepStrictEqual([...new Set(runs.values())], [1], "no job ran twice")
          const counts = yield* client.storage.countByQueueState
          assert.deepStrictEqual(counts, [{ queue: "faults", state: "completed", count: total }])
        }).pipe(Effect.provide(awaOn(url)))
      ),
    300_000
  )

  it.live("when the leader stops, the other worker takes over maintenance", () =>
    withDatabase((url) =>
      Effect.gen(function* () {
        const options: WorkerOptions<never> = {
          queues: { faults: {} },
          handlers: [handler(Count, () => Effect.void)],
          maintenance: fast
        }
        const a = yield* startWorker(url, options)
        yield* eventually(SubscriptionRef.get(a.worker.isLeader), 10_000, "a leads")
        const b = yield* startWorker(url, options)
        yield* Effect.sleep("300 millis")
        assert.isFalse(yield* SubscriptionRef.get(b.worker.isLeader), "only one leader at a time")
        yield* a.stop
        yield* eventually(SubscriptionRef.get(b.worker.isLeader), 10_000, "b takes over")
        // maintenance really runs under the new leader: a scheduled job gets promoted and run
        const client = yield* AwaClient
        const [job] = yield* client.insertMany(Count, [{ n: 1 }], { delay: "100 millis" })
        yield* eventually(
          Effect.map(client.storage.getJob(job!.id), (j) => j.state === "completed"),
          10_000,
          "promoted by the new leader"
        )
        yield* b.stop
      }).pipe(Effect.provide(awaOn(url)))
    )
  )

  it.live("a killed LISTEN connection is re-established and wake-ups resume", () =>
    withDatabase((url) =>
      Effect.gen(function* () {
        const ran: Array<number> = []
        const w = yield* startWorker(url, {
          // polling so slow that only a notification can explain a prompt pickup
          queues: { faults: { pollInterval: "60 seconds" } },
          handlers: [handler(Count, ({ n }) => Effect.sync(() => void ran.push(n)))],
          maintenance: false
        })
        const sql = yield* SqlClient.SqlClient
        const client = yield* AwaClient
        yield* Effect.sleep("300 millis")
        yield* client.insert(Count, { n: 1 })
        yield* eventually(
          Effect.sync(() => ran.length === 1),
          10_000,
          "first pickup by notification"
        )
        const killed = yield* sql<{ n: number }>`
          SELECT count(pg_terminate_backend(pid))::int AS n FROM pg_stat_activity
          WHERE datname = current_database() AND application_name LIKE '% signals'`
        assert.isAtLeast(killed[0]!.n, 1)
        // inserted while nobody listens (re-subscribing takes ≥ 1 s): its NOTIFY is lost, and
        // only the worker's look-for-work on re-subscription can pick it up before the 60 s poll
        yield* client.insert(Count, { n: 2 })
        yield* eventually(
          Effect.sync(() => ran.length === 2),
          10_000,
          "pickup of the job enqueued during the gap"
        )
        // and notifications flow again on the new connection
        yield* client.insert(Count, { n: 3 })
        yield* eventually(
          Effect.sync(() => ran.length === 3),
          10_000,
          "pickup by notification after reconnect"
        )
        assert.deepStrictEqual(ran, [1, 2, 3])
        yield* w.stop
      }).pipe(Effect.provide(awaOn(url)))
    )
  )

  it.live(
    "cancelling a running job from another client interrupts its handler and fires its AbortSignal",
    () =>
      withDatabase((url) =>
        Effect.gen(function* () {
          let started = false
          let aborted = false
          const w = yield* startWorker(url, {
            queues: { faults: {} },
            handlers: [
              handler(Hang, (_args, ctx) =>
                Effect.gen(function* () {
                  ctx.signal.addEventListener("abort", () => {
                    aborted = true
                  })
                  started = true
                  return yield* Effect.never
                })
              )
            ],
            maintenance: false
          })
          const client = yield* AwaClient
          const job = yield* client.insert(Hang, { n: 1 })
          yield* eventually(
            Effect.sync(() => started),
            10_000,
            "handler started"
          )
          const view = yield* client.storage.cancelJob(job.id, "operator says stop")
          assert.strictEqual(view.state, "cancelled")
          yield* eventually(
            Effect.sync(() => aborted),
            10_000,
            "handler interrupted"
          )
          yield* eventually(
            Effect.map(w.worker.running, (n) => n === 0),
            5_000,
            "attempt left the worker"
          )
          assert.strictEqual((yield* client.storage.getJob(job.id)).state, "cancelled")
          yield* w.stop
        }).pipe(Effect.provide(awaOn(url)))
      )
  )

  it.live("a handler that always hangs is interrupted at its deadline and fails after its attempts", () =>
    withDatabase((url) =>
      Effect.gen(function* () {
        let attempts = 0
        const w = yield* startWorker(url, {
          queues: { faults: { deadline: "150 millis" } },
          handlers: [
            handler(Job.define({ ...Hang, backoff: () => 0 }), () =>
              Effect.sync(() => attempts++).pipe(Effect.andThen(Effect.never))
            )
          ],
          maintenance: fast
        })
        const client = yield* AwaClient
        const job = yield* client.insert(Hang, { n: 1 }, { maxAttempts: 3 })
        yield* eventually(
          Effect.map(client.storage.getJob(job.id), (j) => j.state === "failed"),
          20_000,
          "failed"
        )
        const view = yield* client.storage.getJob(job.id)
        assert.strictEqual(attempts, 3)
        assert.deepStrictEqual(
          view.errors.map((e) => e.error),
          ["hard deadline exceeded", "hard deadline exceeded", "hard deadline exceeded"]
        )
        yield* w.stop
      }).pipe(Effect.provide(awaOn(url)))
    )
  )

  it.live("an attempt held by a dead worker is rescued after the staleness and runs again", () =>
    withDatabase((url) =>
      Effect.gen(function* () {
        const client = yield* AwaClient
        const storage = yield* QueueStorage
        const job = yield* client.insert(Count, { n: 7 })
        // a worker claims it and dies without a word
        const [dead] = yield* storage.claim({ queue: "faults", max: 1, deadlineMs: 0, agingIntervalMs: 0 })
        assert.strictEqual(dead!.jobId, job.id)
        const ran: Array<number> = []
        const w = yield* startWorker(url, {
          queues: { faults: {} },
          handlers: [
            handler(Job.define({ ...Count, backoff: () => 0 }), ({ n }) =>
              Effect.sync(() => void ran.push(n))
            )
          ],
          // the staleness is how long the dead worker's attempt waits to be rescued; the retry's
          // own attempt must not look stale before its completion is written (400 ms left too
          // little room for that on a loaded machine)
          heartbeatInterval: "300 millis",
          heartbeatStaleness: "1500 millis",
          maintenance: fast
        })
        yield* eventually(
          Effect.map(storage.getJob(job.id), (j) => j.state === "completed"),
          20_000,
          "rescued and rerun"
        )
        const view = yield* storage.getJob(job.id)
        assert.deepStrictEqual(ran, [7])
        assert.strictEqual(view.attempt, 2)
        assert.strictEqual(view.errors[0]!.error, "heartbeat stale: worker presumed dead")
        // the dead worker's late completion is rejected
        assert.deepStrictEqual(
          yield* storage.finalizeMany([
            { jobId: dead!.jobId, runLease: dead!.runLease, outcome: { _tag: "Complete" } }
          ]),
          [{ _tag: "Stale" }]
        )
        yield* w.stop
      }).pipe(Effect.provide(awaOn(url)))
    )
  )

  it.live("heartbeats keep a handler longer than the staleness alive", () =>
    withDatabase((url) =>
      Effect.gen(function* () {
        const w = yield* startWorker(url, {
          queues: { faults: {} },
          handlers: [handler(Slow, ({ ms }) => Effect.sleep(ms))],
          // 15 heartbeats per staleness period: a loaded machine (or a server with fsync on)
          // delayed a heartbeat past 400 ms when there were 4
          heartbeatInterval: "200 millis",
          heartbeatStaleness: "3 seconds",
          maintenance: fast
        })
        const client = yield* AwaClient
        const job = yield* client.insert(Slow, { ms: 4500 })
        yield* eventually(
          Effect.map(client.storage.getJob(job.id), (j) => j.state === "completed"),
          20_000,
          "completed"
        )
        const view = yield* client.storage.getJob(job.id)
        assert.strictEqual(view.attempt, 1, "never rescued")
        assert.deepStrictEqual(view.errors, [])
        yield* w.stop
      }).pipe(Effect.provide(awaOn(url)))
    )
  )

  it.live("shutdown lets short handlers finish and records a retry for those cut off at the timeout", () =>
    withDatabase((url) =>
      Effect.gen(function* () {
        const w = yield* startWorker(url, {
          queues: { faults: {} },
          handlers: [handler(Slow, ({ ms }) => Effect.sleep(ms))],
          // the short handler has 2.8 s of room inside the timeout, not 0.3 s: a loaded machine
          // delays its timer and its completion, and it was cut off with a 500 ms timeout
          shutdownTimeout: "3 seconds",
          maintenance: false
        })
        const client = yield* AwaClient
        const short = yield* client.insert(Slow, { ms: 200 })
        const long = yield* client.insert(Slow, { ms: 60_000 })
        yield* eventually(
          Effect.map(w.worker.running, (n) => n === 2),
          10_000,
          "both running"
        )
        yield* w.stop
        assert.strictEqual((yield* client.storage.getJob(short.id)).state, "completed")
        const cut = yield* client.storage.getJob(long.id)
        assert.strictEqual(cut.state, "retryable")
        assert.strictEqual(cut.errors.at(-1)!.error, "interrupted: worker shutting down")
      }).pipe(Effect.provide(awaOn(url)))
    )
  )
})
