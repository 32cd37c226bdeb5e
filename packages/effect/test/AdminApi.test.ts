/**
 * The admin HTTP API against Postgres (issue 18): every route, a missing and a wrong token,
 * token-protected reads, read-only mode, health and readiness, and the OpenAPI document. Served
 * in process on an ephemeral port (`NodeHttpServer.layerTest`), called with its `HttpClient`.
 */
import { CronStorage, LeaderLock, QueueStorage } from "@awa/storage"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Redacted } from "effect"
import { HttpClient } from "effect/http"
import { cronDeclaration, fresh, send, withApi } from "./support.ts"

const token = "s3cret-token"

describe("admin HTTP API", () => {
  it.live(
    "reads: queues, status, doctor, capabilities, jobs, job, dlq, dlq entry, cron; open without a token",
    () =>
      withApi(
        { token: Redacted.make(token) },
        Effect.gen(function* () {
          const storage = yield* QueueStorage
          const cron = yield* CronStorage.CronStorage
          const q = fresh("api-reads")
          yield* storage.configureQueue(q, { dlq: true })
          const [a, b] = yield* storage.enqueueMany([
            { kind: "k", queue: q, args: { n: 1 }, maxAttempts: 1 },
            { kind: "k", queue: q, args: { n: 2 } }
          ])
          const [c] = yield* storage.claim({ queue: q, max: 1, deadlineMs: 0, agingIntervalMs: 0 })
          yield* storage.finalizeMany([
            { jobId: c!.jobId, runLease: c!.runLease, outcome: { _tag: "Fail", error: "x" } }
          ])
          const name = fresh("api-cron")
          yield* cron.upsert([cronDeclaration(name, q)])

          const queues = yield* send("GET", "/api/queues?exact=true&window=60")
          assert.strictEqual(queues.status, 200)
          const mine = queues.body.queues.find((x: { queue: string }) => x.queue === q)
          assert.deepStrictEqual(
            [mine.available, mine.deadLettered, mine.stored],
            [1, 1, { completed: 0, failed: 0, cancelled: 0 }]
          )
          assert.strictEqual((yield* send("GET", "/api/queues?window=abc")).status, 400)
          assert.strictEqual((yield* send("GET", "/api/queues?window=0")).status, 400)

          const status = yield* send("GET", "/api/status")
          assert.deepStrictEqual([status.status, status.body.schemaVersion], [200, status.body.latestVersion])
          const doctor = yield* send("GET", "/api/doctor")
          assert.strictEqual(doctor.status, 200)
          assert.strictEqual(doctor.body.find((x: { name: string }) => x.name === "schema").status, "pass")
          assert.deepStrictEqual((yield* send("GET", "/api/capabilities")).body, {
            readOnly: false,
            authReads: false,
            actions: true
          })

          const jobs = yield* send("GET", `/api/jobs?queue=${q}&state=available`)
          assert.deepStrictEqual(
            jobs.body.map((j: { id: string }) => j.id),
            [b!.id.toString()]
          )
          const job = yield* send("GET", `/api/jobs/${b!.id}`)
          assert.deepStrictEqual([job.status, job.body.args], [200, { n: 2 }])
          assert.strictEqual((yield* send("GET", "/api/jobs/999999999")).status, 404)
          assert.strictEqual((yield* send("GET", "/api/jobs/abc")).status, 400)

          const dlq = yield* send("GET", `/api/dlq?queue=${q}`)
          assert.deepStrictEqual(
            dlq.body.map((e: { id: string }) => e.id),
            [a!.id.toString()]
          )
          const entry = yield* send("GET", `/api/dlq/${a!.id}`)
          assert.deepStrictEqual([entry.status, entry.body.reason], [200, "terminal_error"])
          const schedules = yield* send("GET", "/api/cron")
          assert.isTrue(schedules.body.schedules.some((s: { name: string }) => s.name === name))
        })
      )
  )

  it.live(
    "actions need the bearer token: missing or wrong is 401 and changes nothing; with it every action works",
    () =>
      withApi(
        { token: Redacted.make(token) },
        Effect.gen(function* () {
          const storage = yield* QueueStorage
          const cron = yield* CronStorage.CronStorage
          const q = fresh("api-actions")
          yield* storage.configureQueue(q, { dlq: true })
          const [a, b, d] = yield* storage.enqueueMany([
            { kind: "k", queue: q, args: { n: 1 } },
            { kind: "k", queue: q, args: { n: 2 }, maxAttempts: 1 },
            { kind: "k", queue: q, args: { n: 3 }, maxAttempts: 1 }
          ])
          const paused = () =>
            Effect.map(storage.queueStats(), (r) => r.queues.find((x) => x.queue === q)!.paused)

          const missing = yield* send("POST", `/api/queues/${q}/pause`)
          const wrong = yield* send("POST", `/api/queues/${q}/pause`, "not-the-token")
          assert.deepStrictEqual([missing.status, wrong.status], [401, 401])
          assert.isFalse(yield* paused())

          assert.deepStrictEqual((yield* send("POST", `/api/queues/${q}/pause`, token)).body, {
            queue: q,
            paused: true
          })
          assert.isTrue(yield* paused())
          assert.strictEqual((yield* send("POST", `/api/queues/${q}/resume`, token)).status, 200)
          assert.isFalse(yield* paused())

          // b and d fail into the DLQ
          const claimed = yield* storage.claim({ queue: q, max: 3, deadlineMs: 0, agingIntervalMs: 0 })
          yield* storage.finalizeMany(
            claimed
              .filter((c) => c.jobId !== a!.id)
              .map((c) => ({
                jobId: c.jobId,
                runLease: c.runLease,
                outcome: { _tag: "Fail" as const, error: "x" }
              }))
          )
          const cancelled = yield* send("POST", `/api/jobs/${a!.id}/cancel`, token)
          assert.deepStrictEqual([cancelled.status, cancelled.body.state], [200, "cancelled"])
          // a finished job cannot be cancelled again: InvalidTransition is a 409
          assert.strictEqual((yield* send("POST", `/api/jobs/${a!.id}/cancel`, token)).status, 409)
          const retried = yield* send("POST", `/api/jobs/${a!.id}/retry`, token)
          assert.deepStrictEqual([retried.status, retried.body.state], [200, "available"])
          const fromDlq = yield* send("POST", `/api/dlq/${b!.id}/retry`, token)
          assert.deepStrictEqual([fromDlq.status, fromDlq.body.state], [200, "available"])
          assert.deepStrictEqual((yield* send("DELETE", `/api/dlq/${d!.id}`, token)).body, { purged: 1 })
          assert.strictEqual((yield* send("DELETE", `/api/dlq/${d!.id}`, token)).status, 404)
          const drained = yield* send("POST", `/api/queues/${q}/drain`, token)
          assert.deepStrictEqual(drained.body, { queue: q, cancelled: 2 })

          const name = fresh("api-cron")
          yield* cron.upsert([cronDeclaration(name, q)])
          assert.strictEqual((yield* send("POST", `/api/cron/${name}/pause`)).status, 401)
          assert.deepStrictEqual((yield* send("POST", `/api/cron/${name}/pause`, token)).body, {
            name,
            paused: true
          })
          assert.deepStrictEqual((yield* send("POST", `/api/cron/${name}/resume`, token)).body, {
            name,
            paused: false
          })
          const triggered = yield* send("POST", `/api/cron/${name}/trigger`, token)
          assert.deepStrictEqual(
            [triggered.status, triggered.body.queue, triggered.body.state],
            [200, q, "available"]
          )
          assert.strictEqual((yield* send("POST", "/api/cron/no-such/trigger", token)).status, 404)
        })
      )
  )

  it.live("without a configured token actions are refused; authReads puts reads behind the token too", () =>
    Effect.gen(function* () {
      yield* withApi(
        {},
        Effect.gen(function* () {
          assert.strictEqual((yield* send("POST", "/api/queues/x/pause", "anything")).status, 401)
          assert.strictEqual((yield* send("GET", "/api/queues")).status, 200)
        })
      )
      yield* withApi(
        { token: Redacted.make(token), authReads: true },
        Effect.gen(function* () {
          assert.strictEqual((yield* send("GET", "/api/queues")).status, 401)
          assert.strictEqual((yield* send("GET", "/api/queues", "wrong")).status, 401)
          assert.strictEqual((yield* send("GET", "/api/queues", token)).status, 200)
          // health stays open for orchestrators
          assert.strictEqual((yield* send("GET", "/healthz")).status, 200)
        })
      )
    })
  )

  it.live("read-only mode answers 503 to every action, token or not, and changes nothing", () =>
    withApi(
      { token: Redacted.make(token), readOnly: true },
      Effect.gen(function* () {
        const storage = yield* QueueStorage
        const q = fresh("api-ro")
        const [job] = yield* storage.enqueueMany([{ kind: "k", queue: q, args: {} }])
        for (const [method, path] of [
          ["POST", `/api/queues/${q}/pause`],
          ["POST", `/api/queues/${q}/resume`],
          ["POST", `/api/queues/${q}/drain`],
          ["POST", `/api/jobs/${job!.id}/cancel`],
          ["POST", `/api/jobs/${job!.id}/retry`],
          ["POST", `/api/dlq/${job!.id}/retry`],
          ["DELETE", `/api/dlq/${job!.id}`],
          ["POST", "/api/cron/x/pause"],
          ["POST", "/api/cron/x/resume"],
          ["POST", "/api/cron/x/trigger"]
        ] as const) {
          const reply = yield* send(method, path, token)
          assert.strictEqual(reply.status, 503, `${method} ${path}`)
        }
        assert.strictEqual((yield* storage.getJob(job!.id)).state, "available")
        assert.deepStrictEqual((yield* send("GET", "/api/capabilities")).body, {
          readOnly: true,
          authReads: false,
          actions: false
        })
        assert.strictEqual((yield* send("GET", "/api/queues")).status, 200)
      })
    )
  )

  it.live(
    "healthz and readyz: ready needs the current schema and a leader; the OpenAPI document lists the routes",
    () =>
      Effect.gen(function* () {
        yield* withApi(
          {},
          Effect.gen(function* () {
            assert.deepStrictEqual((yield* send("GET", "/healthz")).body, {
              status: "ok",
              database: "reachable"
            })
            const noLeader = yield* send("GET", "/readyz")
            assert.deepStrictEqual(
              [noLeader.status, noLeader.body.message],
              [503, "no maintenance leader holds its lock"]
            )
            const lock = yield* LeaderLock.LeaderLock
            // the leader's lock held for this scope, on a connection of its own
            const ready = yield* Effect.scoped(
              Effect.gen(function* () {
                assert.strictEqual((yield* lock.tryAcquire)._tag, "Some")
                return yield* send("GET", "/readyz")
              })
            )
            assert.deepStrictEqual([ready.status, ready.body.status], [200, "ready"])
            const openapi = yield* send("GET", "/openapi.json")
            assert.strictEqual(openapi.status, 200)
            for (const path of [
              "/api/queues",
              "/api/jobs/{id}",
              "/api/queues/{queue}/drain",
              "/healthz",
              "/readyz"
            ])
              assert.property(openapi.body.paths, path)
            assert.property(openapi.body.components.securitySchemes, "bearer")
            // Prometheus text: queue depth and finalizations as the statistics count them
            const storage = yield* QueueStorage
            const q = fresh("api-metrics")
            yield* storage.enqueueMany([
              { kind: "k", queue: q, args: {} },
              { kind: "k", queue: q, args: {} }
            ])
            const [c] = yield* storage.claim({ queue: q, max: 1, deadlineMs: 0, agingIntervalMs: 0 })
            yield* storage.finalizeMany([
              { jobId: c!.jobId, runLease: c!.runLease, outcome: { _tag: "Complete" } }
            ])
            const client = yield* HttpClient.HttpClient
            const scrape = () => Effect.flatMap(client.get("/metrics"), (r) => r.text)
            const first = yield* scrape()
            assert.include(first, `awa_queue_depth{awa_queue="${q}",state="available"} 1`)
            assert.include(first, `awa_job_finalized{awa_queue="${q}",outcome="completed"} 1`)
            assert.include(first, "awa_leader_present 0")
            // counters advance by what was finalized since the last scrape, not by the total again
            const [d] = yield* storage.claim({ queue: q, max: 1, deadlineMs: 0, agingIntervalMs: 0 })
            yield* storage.finalizeMany([
              { jobId: d!.jobId, runLease: d!.runLease, outcome: { _tag: "Complete" } }
            ])
            const second = yield* scrape()
            assert.include(second, `awa_job_finalized{awa_queue="${q}",outcome="completed"} 2`)
            assert.include(second, `awa_queue_depth{awa_queue="${q}",state="available"} 0`)
          })
        )
        yield* withApi(
          {},
          Effect.gen(function* () {
            const behind = yield* send("GET", "/readyz")
            assert.strictEqual(behind.status, 503)
            assert.match(behind.body.message, /^schema at version 0, this code needs \d+$/)
          }),
          false
        )
      })
  )
})
