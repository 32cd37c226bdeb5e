/**
 * Operator actions on jobs that wait for a callback (issue 21 item 4): `awa callback
 * complete|fail|retry|resume <job id>` and the admin API's `POST /api/jobs/:id/callback/:action`.
 * Jobs are parked straight through storage (claim, register, park), as a worker would.
 */
import { randomUUID } from "node:crypto"
import { Admin, Callbacks } from "@awa/runtime"
import { CallbackStorage, CronStorage, PgCallbackStorage, PgQueueStorage, QueueStorage } from "@awa/storage"
import { TestDatabase } from "@awa/testing"
import { NodeHttpServer, NodeServices } from "@effect/platform-node"
import { PgClient } from "@effect/sql-pg"
import { assert, describe, it } from "@effect/vitest"
import { Console, Effect, Layer, Option, Redacted } from "effect"
import { HttpClient, HttpClientRequest, HttpRouter } from "effect/http"
import * as AdminApi from "../src/AdminApi.ts"
import * as Cli from "../src/Cli.ts"

const awa = (url: string, ...args: ReadonlyArray<string>) =>
  Effect.gen(function* () {
    const out: Array<string> = []
    const err: Array<string> = []
    const capture: Console.Console = {
      ...globalThis.console,
      log: (...a: ReadonlyArray<unknown>) => void out.push(a.map(String).join(" ")),
      error: (...a: ReadonlyArray<unknown>) => void err.push(a.map(String).join(" "))
    }
    const code = yield* Cli.run(["--database-url", url, "--json", ...args]).pipe(
      Effect.provideService(Console.Console, capture),
      Effect.provide(NodeServices.layer)
    )
    return { code, out: out.join("\n"), err: err.join("\n") }
  })

/** Storage and the callback services on `url`. */
const storageOn = (url: string) =>
  Layer.mergeAll(
    PgQueueStorage.layer(),
    CronStorage.layerPg(),
    Callbacks.layer.pipe(Layer.provideMerge(PgCallbackStorage.layer()))
  ).pipe(Layer.provideMerge(PgClient.layer({ url: Redacted.make(url), maxConnections: 3 })))

const withDatabase = <A, E, R>(body: (url: string) => Effect.Effect<A, E, R>) =>
  Effect.scoped(Effect.flatMap(TestDatabase.acquire(), ({ url }) => body(url)))

/** A parked job on a fresh queue; its id. */
const parked = Effect.gen(function* () {
  const storage = yield* QueueStorage
  const callbacks = yield* CallbackStorage
  const queue = `waiting-${randomUUID().slice(0, 8)}`
  yield* storage.enqueueMany([{ kind: "w", queue, args: {} }])
  const [job] = yield* storage.claim({ queue, max: 1, deadlineMs: 0, agingIntervalMs: 0 })
  const id = Option.getOrThrow(yield* callbacks.register(job!, { timeoutMs: 3_600_000 }))
  yield* callbacks.park(job!, id)
  return job!.jobId
})

const stateOf = (id: bigint) => Effect.flatMap(Effect.service(QueueStorage), (s) => s.getJob(id))

const post = (path: string, body: unknown, bearer?: string) =>
  Effect.gen(function* () {
    const client = yield* HttpClient.HttpClient
    let request = HttpClientRequest.bodyJsonUnsafe(HttpClientRequest.post(path), body)
    if (bearer !== undefined) request = HttpClientRequest.bearerToken(request, bearer)
    const response = yield* client.execute(request)
    const text = yield* response.text
    return { status: response.status, body: text === "" ? null : JSON.parse(text) }
  })

describe("operator actions on waiting jobs", () => {
  it.live("awa callback complete | fail | retry | resume, and a job with no pending callback", () =>
    withDatabase((url) =>
      Effect.gen(function* () {
        const a = yield* parked
        const done = yield* awa(url, "callback", "complete", String(a))
        assert.strictEqual(done.code, 0, done.err)
        assert.strictEqual(JSON.parse(done.out).state, "completed")
        const again = yield* awa(url, "callback", "complete", String(a))
        assert.notStrictEqual(again.code, 0)

        const b = yield* parked
        const failed = yield* awa(url, "callback", "fail", String(b), "--error", "declined by ops")
        assert.strictEqual(JSON.parse(failed.out).state, "failed")
        assert.strictEqual((yield* stateOf(b)).errors.at(-1)!.error, "declined by ops")

        const c = yield* parked
        assert.strictEqual(
          JSON.parse((yield* awa(url, "callback", "retry", String(c))).out).state,
          "retryable"
        )
        assert.strictEqual((yield* stateOf(c)).attempt, 0)

        const d = yield* parked
        const resumed = yield* awa(url, "callback", "resume", String(d), "--payload", '{"ok":true}')
        assert.strictEqual(JSON.parse(resumed.out).state, "running")
      }).pipe(Effect.provide(storageOn(url)))
    )
  )

  it.live(
    "POST /api/jobs/:id/callback/:action needs the token; completes, fails, 404s a job with nothing pending",
    () =>
      withDatabase((url) =>
        Effect.gen(function* () {
          const a = yield* parked
          assert.strictEqual((yield* post(`/api/jobs/${a}/callback/complete`, {})).status, 401)
          const ok = yield* post(`/api/jobs/${a}/callback/complete`, {}, "t0ken")
          assert.deepStrictEqual([ok.status, ok.body.state], [200, "completed"])
          assert.strictEqual((yield* post(`/api/jobs/${a}/callback/complete`, {}, "t0ken")).status, 404)
          const b = yield* parked
          const failed = yield* post(`/api/jobs/${b}/callback/fail`, { error: "no" }, "t0ken")
          assert.deepStrictEqual([failed.status, failed.body.state], [200, "failed"])
        }).pipe(
          Effect.provide(
            HttpRouter.serve(AdminApi.layer({ token: Redacted.make("t0ken") }), {
              disableListenLog: true,
              disableLogger: true
            }).pipe(
              Layer.provideMerge(NodeHttpServer.layerTest),
              Layer.provideMerge(Admin.layer().pipe(Layer.provideMerge(storageOn(url))))
            )
          )
        )
      )
  )
})
