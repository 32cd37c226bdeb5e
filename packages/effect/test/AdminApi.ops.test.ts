/**
 * The admin API's additions of issue 18/19's second pass, against Postgres: bodies typed by
 * Schemas (whole bodies equal the Admin service's values: a field a Schema missed would be
 * dropped), the sampled history route, the jobs list's time filters, keyset paging of the DLQ,
 * the job page's unique key and attempt durations, and readiness with its LISTEN check and
 * shutdown (503).
 */
import { Admin } from "@awa/runtime"
import { LeaderLock, QueueStorage, StorageSignals } from "@awa/storage"
import type { PgClient } from "@effect/sql-pg"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Layer, Option, Redacted, Stream } from "effect"
import type { HttpClient } from "effect/http"
import { SqlClient } from "effect/sql"
import * as AdminApi from "../src/AdminApi.ts"
import { asJson, fresh, send, withApi } from "./support.ts"

const token = "0ps-token"
const sampleNow = { minIntervalMs: 0, keepMs: 7_200_000 }

/** A `Readiness` over `signals` (the real LISTEN on the API's pool, or a stand-in). */
const readinessOn = (signals: Layer.Layer<StorageSignals.StorageSignals> | "pg") =>
  AdminApi.Readiness.layer.pipe(Layer.provide(signals === "pg" ? StorageSignals.layerPg() : signals))

/** `body` against the API with `readiness`, while the maintenance leader's lock is held. */
const withLeader = <A, E, X, XE>(
  readiness: Layer.Layer<X, XE, PgClient.PgClient>,
  body: Effect.Effect<A, E, HttpClient.HttpClient>
) =>
  withApi(
    {},
    Effect.gen(function* () {
      const lock = yield* LeaderLock.LeaderLock
      return yield* Effect.scoped(
        Effect.gen(function* () {
          assert.strictEqual((yield* lock.tryAcquire)._tag, "Some")
          return yield* body
        })
      )
    }),
    true,
    readiness
  )

/** A listener whose LISTEN is never confirmed (as while its connection cannot be made). */
const brokenSignals = Layer.succeed(StorageSignals.StorageSignals, { signals: Stream.never })

describe("admin HTTP API: operator additions", () => {
  it.live("bodies are whole: job page (unique key, attempts with durations), status, queues, DLQ entry", () =>
    withApi(
      { token: Redacted.make(token) },
      Effect.gen(function* () {
        const storage = yield* QueueStorage
        const admin = yield* Admin.Admin
        const q = fresh("ops-bodies")
        yield* storage.configureQueue(q, { dlq: true })
        const [job] = yield* storage.enqueueMany([
          { kind: "k", queue: q, args: { n: 1 }, unique: { byQueue: true }, maxAttempts: 2 }
        ])
        const claim = { queue: q, max: 1, deadlineMs: 0, agingIntervalMs: 0 }
        const [first] = yield* storage.claim(claim)
        yield* storage.finalizeMany([
          {
            jobId: first!.jobId,
            runLease: first!.runLease,
            outcome: { _tag: "Retry", delayMs: 0, error: "once" }
          }
        ])
        yield* storage.promoteDue(10)
        const [second] = yield* storage.claim(claim)
        yield* storage.finalizeMany([
          { jobId: second!.jobId, runLease: second!.runLease, outcome: { _tag: "Fail", error: "twice" } }
        ])

        const page = yield* send("GET", `/api/jobs/${job!.id}`)
        assert.strictEqual(page.status, 200)
        assert.deepStrictEqual(page.body, asJson(yield* admin.getJob(job!.id)))
        assert.match(page.body.uniqueKey, /^[0-9a-f]+$/)
        assert.deepStrictEqual(
          page.body.attempts.map((a: { attempt: number; outcome: string }) => [a.attempt, a.outcome]),
          [
            [1, "retryable"],
            [2, "failed"]
          ]
        )
        for (const a of page.body.attempts) assert.isAtLeast(a.durationMs, 0)

        const entry = yield* send("GET", `/api/dlq/${job!.id}`)
        assert.deepStrictEqual(entry.body, asJson(yield* admin.getDlq(job!.id)))
        const status = yield* send("GET", "/api/status")
        const expected = asJson(yield* admin.status) as Record<string, unknown>
        assert.deepStrictEqual({ ...status.body, now: null }, { ...expected, now: null })
        const queues = yield* send("GET", "/api/queues")
        assert.deepStrictEqual(
          Object.keys(queues.body.queues.find((x: { queue: string }) => x.queue === q)).sort(),
          Object.keys((yield* admin.queueStats()).queues.find((x) => x.queue === q)!).sort()
        )
        // the OpenAPI document types them (no bare `{}` for these bodies)
        const openapi = (yield* send("GET", "/openapi.json")).body
        const okSchema = (path: string) =>
          JSON.stringify(openapi.paths[path].get.responses["200"].content["application/json"].schema)
        for (const path of [
          "/api/queues",
          "/api/queues/history",
          "/api/jobs/{id}",
          "/api/status",
          "/api/dlq"
        ])
          assert.notStrictEqual(okSchema(path), "{}", path)
      })
    )
  )

  it.live(
    "history: the leader's samples per queue and bucket; rates in the statistics; reads behind authReads",
    () =>
      withApi(
        { token: Redacted.make(token), authReads: true },
        Effect.gen(function* () {
          const storage = yield* QueueStorage
          const q = fresh("ops-history")
          yield* storage.sampleQueueStats(sampleNow)
          yield* storage.enqueueMany([1, 2, 3].map((n) => ({ kind: "k", queue: q, args: { n } })))
          yield* storage.sampleQueueStats(sampleNow)
          yield* storage.sampleQueueStats(sampleNow)
          assert.strictEqual((yield* send("GET", "/api/queues/history")).status, 401)
          const history = yield* send("GET", "/api/queues/history?window=3600&bucket=60", token)
          assert.strictEqual(history.status, 200)
          const mine = history.body.queues.find((x: { queue: string }) => x.queue === q)
          assert.strictEqual(
            mine.buckets.reduce((n: number, b: { enqueued: number }) => n + b.enqueued, 0),
            3
          )
          assert.strictEqual((yield* send("GET", "/api/queues/history?window=10", token)).status, 400)
          const stats = yield* send("GET", "/api/queues?window=3600", token)
          const rates = stats.body.queues.find((x: { queue: string }) => x.queue === q).rates
          assert.strictEqual(rates.enqueued, 3)
          assert.isAbove(rates.enqueuedPerSecond, 0)
        })
      )
  )

  it.live("jobs filtered by creation and finalization time; the DLQ paged by keyset over HTTP", () =>
    withApi(
      {},
      Effect.gen(function* () {
        const storage = yield* QueueStorage
        const sql = yield* SqlClient.SqlClient
        const q = fresh("ops-time")
        const [old] = yield* storage.enqueueMany([{ kind: "k", queue: q, args: { n: 0 } }])
        const [{ t }] = (yield* sql<{ t: Date }>`SELECT clock_timestamp() AS t`) as [{ t: Date }]
        // the next job's created_at (its transaction's now()) is after `t`
        const [young] = yield* storage.enqueueMany([{ kind: "k", queue: q, args: { n: 1 } }])
        const ids = (path: string) =>
          Effect.map(send("GET", path), (r) => {
            assert.strictEqual(r.status, 200, JSON.stringify(r.body))
            return r.body.map((j: { id: string }) => j.id)
          })
        const at = encodeURIComponent(t.toISOString())
        assert.deepStrictEqual(yield* ids(`/api/jobs?queue=${q}&createdAfter=${at}`), [young!.id.toString()])
        assert.deepStrictEqual(yield* ids(`/api/jobs?queue=${q}&createdBefore=${at}`), [old!.id.toString()])
        // finalized filters see terminal jobs only
        const [c] = yield* storage.claim({ queue: q, max: 1, deadlineMs: 0, agingIntervalMs: 0 })
        yield* storage.finalizeMany([
          { jobId: c!.jobId, runLease: c!.runLease, outcome: { _tag: "Complete" } }
        ])
        assert.deepStrictEqual(yield* ids(`/api/jobs?queue=${q}&finalizedAfter=${at}`), [old!.id.toString()])
        assert.deepStrictEqual(yield* ids(`/api/jobs?queue=${q}&finalizedBefore=${at}`), [])
        assert.strictEqual((yield* send("GET", `/api/jobs?createdAfter=yesterday`)).status, 400)

        const d = fresh("ops-dlq")
        yield* storage.configureQueue(d, { dlq: true })
        yield* storage.enqueueMany(
          [1, 2, 3, 4, 5].map((n) => ({ kind: "k", queue: d, args: { n }, maxAttempts: 1 }))
        )
        const claimed = yield* storage.claim({ queue: d, max: 5, deadlineMs: 0, agingIntervalMs: 0 })
        yield* storage.finalizeMany(
          claimed.map((x) => ({
            jobId: x.jobId,
            runLease: x.runLease,
            outcome: { _tag: "Fail" as const, error: "x" }
          }))
        )
        const all = yield* ids(`/api/dlq?queue=${d}`)
        assert.strictEqual(all.length, 5)
        const pageOne = yield* ids(`/api/dlq?queue=${d}&limit=2`)
        const pageTwo = yield* ids(`/api/dlq?queue=${d}&limit=2&before=${pageOne.at(-1)}`)
        const pageThree = yield* ids(`/api/dlq?queue=${d}&limit=2&before=${pageTwo.at(-1)}`)
        assert.deepStrictEqual([...pageOne, ...pageTwo, ...pageThree], all)
        assert.strictEqual((yield* send("GET", `/api/dlq?before=x`)).status, 400)
      })
    )
  )

  it.live(
    "readyz: LISTEN confirmed is required; after beginShutdown it answers 503 while health stays up",
    () =>
      Effect.gen(function* () {
        yield* withLeader(
          readinessOn("pg"),
          Effect.gen(function* () {
            // the listener's subscription is confirmed asynchronously: wait for it
            let ready = yield* send("GET", "/readyz")
            while (ready.status !== 200) {
              yield* Effect.sleep("25 millis")
              ready = yield* send("GET", "/readyz")
            }
            assert.strictEqual(ready.body.listening, true)
            // provided by `readinessOn` (not in the body's type: found at run time)
            const readiness = yield* Effect.serviceOption(AdminApi.Readiness.Readiness)
            assert.isTrue(Option.isSome(readiness))
            if (Option.isSome(readiness)) yield* readiness.value.beginShutdown
            const down = yield* send("GET", "/readyz")
            assert.deepStrictEqual([down.status, down.body.message], [503, "shutting down"])
            assert.strictEqual((yield* send("GET", "/healthz")).status, 200)
          })
        )
        yield* withLeader(
          readinessOn(brokenSignals),
          Effect.gen(function* () {
            const notListening = yield* send("GET", "/readyz")
            assert.deepStrictEqual(
              [notListening.status, notListening.body.message],
              [503, "LISTEN not connected: this process receives no notifications"]
            )
          })
        )
      })
  )
})
