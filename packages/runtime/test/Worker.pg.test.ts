import { Job, type JobState } from "@awa/core"
import { QueueStorage } from "@awa/storage"
import { TestDatabase } from "@awa/testing"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Layer, Schema } from "effect"
import { SqlClient } from "effect/sql"
import * as Awa from "../src/Awa.ts"
import { AwaClient } from "../src/AwaClient.ts"
import { handler } from "../src/Handler.ts"
import { eventually } from "./support.ts"

const Ping = Job.define({ kind: "ping", args: Schema.Struct({ n: Schema.Number }), queue: "e2e" })
const Flaky = Job.define({
  kind: "flaky",
  args: Schema.Struct({ n: Schema.Number }),
  queue: "e2e",
  backoff: () => 0
})
const Sleepy = Job.define({ kind: "sleepy", args: Schema.Struct({ n: Schema.Number }), queue: "e2e" })
const Doomed = Job.define({ kind: "doomed", args: Schema.Struct({ n: Schema.Number }), queue: "e2e" })
const Quitter = Job.define({ kind: "quitter", args: Schema.Struct({ n: Schema.Number }), queue: "e2e" })
const Strict = Job.define({ kind: "strict", args: Schema.Struct({ n: Schema.Number }), queue: "e2e" })

const snoozed = new Set<number>()
const handlers = [
  handler(Ping, () => Effect.void),
  handler(Flaky, (_args, ctx) =>
    ctx.job.attempt < 3
      ? Effect.fail(new Job.JobRetryableError({ message: `flaky attempt ${ctx.job.attempt}` }))
      : Effect.void
  ),
  handler(Sleepy, ({ n }) =>
    Effect.suspend(() => {
      if (snoozed.has(n)) return Effect.succeed(Job.JobResult.completed)
      snoozed.add(n)
      return Effect.succeed(Job.JobResult.snooze("10 millis"))
    })
  ),
  handler(Doomed, () => Effect.fail(new Job.JobTerminalError({ message: "doomed from the start" }))),
  handler(Quitter, () => Effect.succeed(Job.JobResult.cancel("not worth it"))),
  handler(Strict, () => Effect.void)
]

const fastMaintenance = {
  electionInterval: "50 millis",
  promoteInterval: "20 millis",
  rescueInterval: "100 millis",
  rotateInterval: "100 millis"
} as const

const AwaLive = Awa.layerPg().pipe(Layer.provideMerge(TestDatabase.layer({ maxConnections: 12 })))

const countStates = Effect.gen(function* () {
  const storage = yield* QueueStorage
  const counts = yield* storage.countByQueueState
  const out: Partial<Record<JobState, number>> = {}
  for (const c of counts) out[c.state] = (out[c.state] ?? 0) + c.count
  return out
})

describe("Worker on Postgres", () => {
  it.live(
    "runs 10,200 jobs of every outcome kind end to end: complete, retry then succeed, snooze, fail, cancel, undecodable args",
    () =>
      Effect.gen(function* () {
        const client = yield* AwaClient
        const per = 1700 // 6 kinds × 1,700 + 1 ≈ 10,200 jobs
        const range = Array.from({ length: per }, (_, n) => ({ n }))
        yield* client.insertMany(Ping, range)
        yield* client.insertMany(Flaky, range)
        yield* client.insertMany(Sleepy, range)
        yield* client.insertMany(Doomed, range)
        yield* client.insertMany(Quitter, range)
        // args that no longer decode: written around the Schema, as an older producer would have
        yield* client.storage.enqueueMany(
          Array.from({ length: per }, () => ({ kind: "strict", queue: "e2e", args: { n: "not a number" } }))
        )
        // and a kind nobody handles (this worker fails it: see its options)
        yield* client.storage.enqueueMany([{ kind: "nobody_handles_this", queue: "e2e", args: {} }])
        yield* Effect.gen(function* () {
          yield* eventually(
            Effect.map(
              countStates,
              (c) =>
                (c.completed ?? 0) === 3 * per &&
                (c.failed ?? 0) === 2 * per + 1 &&
                (c.cancelled ?? 0) === per
            ),
            60_000,
            "every job finalized"
          )
        }).pipe(
          Effect.provide(
            // the unknown kind's terminal path (the default, "retry", is UnknownKind.pg.test.ts's)
            Awa.worker({
              queues: { e2e: { maxConcurrency: 50 } },
              handlers,
              maintenance: fastMaintenance,
              onUnknownKind: "fail"
            })
          ),
          Effect.scoped
        )
        const storage = client.storage
        const flaky = (yield* storage.listJobs({ kind: "flaky", limit: 1 }))[0]!
        assert.strictEqual(flaky.state, "completed")
        assert.strictEqual(flaky.attempt, 3)
        assert.deepStrictEqual(
          flaky.errors.map((e) => e.error),
          ["flaky attempt 1", "flaky attempt 2"]
        )
        const sleepy = (yield* storage.listJobs({ kind: "sleepy", limit: 1 }))[0]!
        assert.strictEqual(sleepy.attempt, 1, "a snooze does not count as an attempt")
        const doomed = (yield* storage.listJobs({ kind: "doomed", limit: 1 }))[0]!
        assert.deepStrictEqual(
          [doomed.state, doomed.attempt, doomed.errors.at(-1)!.error],
          ["failed", 1, "doomed from the start"]
        )
        const strict = (yield* storage.listJobs({ kind: "strict", limit: 1 }))[0]!
        assert.strictEqual(strict.state, "failed")
        assert.match(strict.errors.at(-1)!.error, /^args failed to decode: /)
        const unknown = (yield* storage.listJobs({ kind: "nobody_handles_this", limit: 1 }))[0]!
        assert.strictEqual(unknown.errors.at(-1)!.error, "unknown job kind: nobody_handles_this")
        const quitter = (yield* storage.listJobs({ kind: "quitter", limit: 1 }))[0]!
        assert.strictEqual(quitter.errors.at(-1)!.error, "cancelled: not worth it")
      }).pipe(Effect.provide(AwaLive))
  )

  it.live("insert joins the caller's transaction: a rolled-back insert never runs", () =>
    Effect.gen(function* () {
      const client = yield* AwaClient
      const sql = yield* SqlClient.SqlClient
      const ran: Array<number> = []
      const Track = Job.define({ kind: "track", args: Schema.Struct({ n: Schema.Number }), queue: "tx" })
      yield* sql
        .withTransaction(Effect.andThen(client.insert(Track, { n: 1 }), Effect.fail("abort" as const)))
        .pipe(Effect.flip)
      yield* sql.withTransaction(client.insert(Track, { n: 2 }))
      yield* Effect.gen(function* () {
        yield* eventually(
          Effect.sync(() => ran.length === 1),
          10_000,
          "the committed job ran"
        )
        yield* Effect.sleep("300 millis")
      }).pipe(
        Effect.provide(
          Awa.worker({
            queues: { tx: {} },
            handlers: [handler(Track, ({ n }) => Effect.sync(() => void ran.push(n)))],
            maintenance: false
          })
        ),
        Effect.scoped
      )
      assert.deepStrictEqual(ran, [2])
    }).pipe(Effect.provide(AwaLive))
  )

  it.live("bad worker configuration fails layer construction with every issue named", () =>
    Effect.gen(function* () {
      const error = yield* Effect.flip(
        Effect.scoped(
          Layer.build(
            Awa.worker({
              queues: { " bad": { maxConcurrency: 0 } },
              handlers: [handler(Ping, () => Effect.void), handler(Ping, () => Effect.void)],
              heartbeatInterval: "10 seconds",
              heartbeatStaleness: "5 seconds"
            })
          )
        )
      )
      assert.strictEqual(error._tag, "AwaConfigError")
      if (error._tag === "AwaConfigError") {
        const paths = error.issues.map((i) => i.path).sort()
        assert.deepStrictEqual(paths, [
          "handlers.ping",
          "heartbeatStaleness",
          "queues. bad",
          "queues. bad.maxConcurrency"
        ])
      }
    }).pipe(Effect.provide(AwaLive))
  )
})

describe("AwaClient", () => {
  it.live("cancelByUniqueKey derives the key like insert and cancels the live holder", () =>
    Effect.gen(function* () {
      const client = yield* AwaClient
      const Digest = Job.define({
        kind: "digest",
        args: Schema.Struct({ day: Schema.String }),
        queue: "digests",
        defaults: { unique: { byArgs: true } }
      })
      const job = yield* client.insert(Digest, { day: "2026-11-30" })
      const other = yield* client.insert(Digest, { day: "2026-12-01" })
      const cancelled = yield* client.cancelByUniqueKey(Digest, { day: "2026-11-30" }, { reason: "holiday" })
      assert.strictEqual(cancelled._tag === "Some" ? cancelled.value : undefined, job.id)
      assert.strictEqual((yield* client.storage.getJob(job.id)).state, "cancelled")
      assert.strictEqual((yield* client.storage.getJob(other.id)).state, "available")
      // the key is free again
      const again = yield* client.insert(Digest, { day: "2026-11-30" })
      assert.isTrue(again.id > other.id)
      const notUnique = yield* Effect.flip(client.cancelByUniqueKey(Ping, { n: 1 }))
      assert.strictEqual(notUnique._tag, "ValidationError")
    }).pipe(Effect.provide(AwaLive))
  )
})
