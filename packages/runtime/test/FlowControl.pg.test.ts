/**
 * Flow control on Postgres (issue 20; capabilities.md §13, §25): the capped depth count, reject
 * and signal at insert, and hot overrides written by one client and applied by a worker that
 * reads them from the database.
 */
import { BackpressureRejected, Job, ValidationError } from "@awa/core"
import { FlowStorage, PgQueueStorage } from "@awa/storage"
import { TestDatabase } from "@awa/testing"
import { assert, layer } from "@effect/vitest"
import { Effect, Exit, Layer, Schema, Scope } from "effect"
import { SqlClient } from "effect/sql"
import * as Awa from "../src/Awa.ts"
import * as AwaClient from "../src/AwaClient.ts"
import { handler } from "../src/Handler.ts"
import * as QueueOverrides from "../src/QueueOverrides.ts"
import { captureWarnings, eventually, plainQueueBase } from "./support.ts"

const Deep = Job.define({ kind: "deep", args: Schema.Struct({ n: Schema.Number }), queue: "deep" })
const Tuned = Job.define({ kind: "tuned", args: Schema.Struct({ n: Schema.Number }), queue: "tuned" })
const range = (n: number) => Array.from({ length: n }, (_, i) => ({ n: i }))

const AwaLive = Awa.layerPg().pipe(Layer.provideMerge(TestDatabase.layer({ maxConnections: 8 })))

/** A second client on the same database: its own storage and flow layers (not the worker's). */
const OtherClient = Layer.fresh(
  AwaClient.layer({ tracing: false }).pipe(
    Layer.provide(Layer.mergeAll(Layer.fresh(PgQueueStorage.layer()), Layer.fresh(FlowStorage.layerPg())))
  )
)

layer(AwaLive, { excludeTestServices: true, timeout: "60 seconds" })("flow control on Postgres", (it) => {
  it.effect("queue_depth is a capped count: min(depth, cap), claimed and cancelled jobs not counted", () =>
    Effect.gen(function* () {
      const client = yield* AwaClient.AwaClient
      const flow = yield* FlowStorage.FlowStorage
      const jobs = yield* client.insertMany(Deep, range(50))
      yield* client.insertMany(Deep, range(10), { priority: 1 })
      assert.deepStrictEqual(yield* flow.depth("deep", 1000), { count: 60, capped: false })
      assert.deepStrictEqual(yield* flow.depth("deep", 60), { count: 60, capped: true })
      assert.deepStrictEqual(yield* flow.depth("deep", 7), { count: 7, capped: true })
      yield* client.storage.claim({ queue: "deep", max: 5, deadlineMs: 0, agingIntervalMs: 0 })
      yield* client.storage.cancelJob(jobs[40]!.id, "test")
      assert.deepStrictEqual(yield* flow.depth("deep", 1000), { count: 54, capped: false })
      assert.deepStrictEqual(yield* flow.depth("nothing_here", 10), { count: 0, capped: false })
      const bad = yield* Effect.flip(flow.depth("deep", 0))
      assert.instanceOf(bad, ValidationError)
    })
  )

  it.effect(
    "reject refuses a whole batch inside the caller's transaction, before anything is written; signal reports the depth",
    () =>
      Effect.gen(function* () {
        const client = yield* AwaClient.AwaClient
        const sql = yield* SqlClient.SqlClient
        yield* client.insertMany(Deep, range(20), { queue: "bounded" })
        const error = yield* Effect.flip(
          sql.withTransaction(
            client.insertMany(Deep, range(100), { queue: "bounded", backpressure: { reject: { limit: 20 } } })
          )
        )
        assert.instanceOf(error, BackpressureRejected)
        assert.deepStrictEqual(
          { ...error },
          { _tag: "BackpressureRejected", queue: "bounded", depth: 20, limit: 20 }
        )
        const flow = yield* FlowStorage.FlowStorage
        assert.deepStrictEqual(
          yield* flow.depth("bounded", 1000),
          { count: 20, capped: false },
          "no partial insert"
        )
        const admitted = yield* client.insertMany(Deep, range(3), {
          queue: "bounded",
          backpressure: { reject: { limit: 21 } }
        })
        assert.strictEqual(admitted.length, 3)
        const signalled = yield* client.insert(Deep, { n: 0 }, { queue: "signalled", backpressure: "signal" })
        assert.deepStrictEqual(signalled.pressure, { queue: "signalled", depth: 0, capped: false })
      })
  )

  it.effect(
    "overrides set by another client reach a running worker within its refresh interval; clear reverts; bad values are refused or ignored",
    () =>
      Effect.gen(function* () {
        const deadlines: Array<{ n: number; ms: number }> = []
        const scope = yield* Scope.make()
        yield* Layer.buildWithScope(
          Awa.worker({
            queues: { tuned: { deadline: "5 minutes", pollInterval: "20 millis" } },
            handlers: [
              // the attempt's deadline as the claim stamped it (-1: none)
              handler(Tuned, ({ n }, ctx) =>
                Effect.gen(function* () {
                  const sql = yield* SqlClient.SqlClient
                  const [row] = yield* sql<{ ms: bigint | null }>`
                    SELECT (extract(epoch FROM deadline_at - claimed_at) * 1000)::int8 AS ms
                    FROM awa.claims WHERE job_id = ${ctx.job.id} AND run_lease = ${ctx.job.runLease}`
                  deadlines.push({ n, ms: row === undefined || row.ms === null ? -1 : Number(row.ms) })
                }).pipe(Effect.orDie)
              )
            ],
            overrideRefreshInterval: "200 millis",
            watchdog: { thread: false },
            maintenance: false
          }),
          scope
        )
        const client = yield* AwaClient.AwaClient
        const other = yield* Effect.provide(AwaClient.AwaClient, OtherClient)
        let n = 0
        /** Inserts a job and waits for it to run; its attempt's deadline span. */
        const probe = Effect.gen(function* () {
          const mine = ++n
          yield* client.insert(Tuned, { n: mine })
          yield* eventually(
            Effect.sync(() => deadlines.some((d) => d.n === mine)),
            20_000,
            `job ${mine} ran`
          )
          return deadlines.find((d) => d.n === mine)!.ms
        })
        assert.strictEqual(yield* probe, 300_000)

        // refused before anything is written
        const refused = yield* Effect.flip(other.setQueueOverrides("tuned", { deadline: "8 days" }))
        assert.instanceOf(refused, ValidationError)
        assert.strictEqual((refused as ValidationError).field, "deadline")
        const refusedRate = yield* Effect.flip(
          other.setQueueOverrides("tuned", { rateLimit: { maxRate: 0 } })
        )
        assert.strictEqual((refusedRate as ValidationError).field, "rateLimit")
        assert.deepStrictEqual(yield* other.getQueueOverrides("tuned"), [])

        const set = yield* other.setQueueOverrides("tuned", { deadline: "1 hour", claimBatchSize: 5 })
        assert.deepStrictEqual(set, { deadlineMs: 3_600_000, claimBatchSize: 5 })
        const setAt = Date.now()
        yield* eventually(
          Effect.map(probe, (ms) => ms === 3_600_000),
          20_000,
          "the override applied"
        )
        const appliedAfter = Date.now() - setAt
        const shown = yield* client.getQueueOverrides()
        assert.deepStrictEqual(
          shown.map((o) => [o.queue, o.overrides, o.invalid]),
          [["tuned", { deadlineMs: 3_600_000, claimBatchSize: 5 }, []]]
        )

        // a value written around the API is ignored by the worker (logged); the code's value holds
        const sql = yield* SqlClient.SqlClient
        yield* sql`UPDATE awa.queue_meta SET overrides = '{"deadlineMs": -5}'::jsonb WHERE queue = 'tuned'`
        yield* eventually(
          Effect.map(probe, (ms) => ms === 300_000),
          20_000,
          "the bad override ignored"
        )
        const [view] = yield* other.getQueueOverrides("tuned")
        assert.deepStrictEqual(
          view?.invalid.map((i) => i.field),
          ["deadlineMs"]
        )

        yield* other.setQueueOverrides("tuned", { deadline: 0 })
        yield* eventually(
          Effect.map(probe, (ms) => ms < 0),
          20_000,
          "a deadline override may cross zero"
        )
        assert.isTrue(yield* other.clearQueueOverrides("tuned"))
        assert.isFalse(yield* other.clearQueueOverrides("tuned"))
        yield* eventually(
          Effect.map(probe, (ms) => ms === 300_000),
          20_000,
          "cleared: the code's deadline again"
        )
        yield* Scope.close(scope, Exit.void)
        // loose wall-clock bound on a loaded machine: the refresh is 200 ms, a claim follows a poll
        assert.isBelow(appliedAfter, 10_000)
      })
  )
})

layer(Awa.layerSim(), { excludeTestServices: true })("applying overrides", (it) => {
  it.effect(
    "a rate override on a queue without a limiter is ignored with a warning; a limiter is retuned and reverted",
    () =>
      Effect.gen(function* () {
        const { warnings, layer: capture } = captureWarnings()
        const base = plainQueueBase
        const live = QueueOverrides.liveSettings(base, 0)
        const reported = new Map<string, string>()
        yield* QueueOverrides.apply(
          base,
          live,
          { rateLimit: { maxRate: 5, burst: 1 }, pollIntervalMs: 50 },
          reported
        ).pipe(Effect.provide(capture))
        assert.strictEqual(live.limiter, undefined)
        assert.strictEqual(live.pollIntervalMs, 50, "the other fields apply")
        assert.strictEqual(warnings.length, 1)
        assert.match(warnings[0]!, /rateLimit override of queue plain ignored/)
        // the same set again: not logged twice
        yield* QueueOverrides.apply(
          base,
          live,
          { rateLimit: { maxRate: 5, burst: 1 }, pollIntervalMs: 50 },
          reported
        ).pipe(Effect.provide(capture))
        assert.strictEqual(warnings.length, 1)

        const limited = { ...base, queue: "limited", rateLimit: { maxRate: 10, burst: 10 } }
        const liveLimited = QueueOverrides.liveSettings(limited, 0)
        yield* QueueOverrides.apply(limited, liveLimited, { rateLimit: { maxRate: 2, burst: 3 } }, reported)
        assert.deepStrictEqual(liveLimited.limiter?.current(), { maxRate: 2, burst: 3 })
        yield* QueueOverrides.apply(limited, liveLimited, undefined, reported)
        assert.deepStrictEqual(liveLimited.limiter?.current(), { maxRate: 10, burst: 10 })
      })
  )
})
