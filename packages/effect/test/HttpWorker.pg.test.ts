/**
 * The HTTP worker and the callback receiver (capabilities.md §18) against a real function on
 * loopback: sync and async modes with §18's status mapping, custom headers, the signed callback
 * resolving a parked job, and what the callback-only server refuses.
 */
import { createServer, type IncomingMessage, type Server } from "node:http"
import type { AddressInfo } from "node:net"
import { AwaConfigError, CallbackSignature, type JobState } from "@awa/core"
import { Awa, AwaClient, HttpWorker } from "@awa/runtime"
import { QueueStorage } from "@awa/storage"
import { TestDatabase } from "@awa/testing"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Exit, Layer } from "effect"
import * as CallbackRoutes from "../src/CallbackRoutes.ts"

const secret = "07".repeat(32)
const key = CallbackSignature.keyFromHex(secret) as CallbackSignature.SigningKey

interface Seen {
  readonly path: string
  readonly headers: IncomingMessage["headers"]
  readonly body: Record<string, unknown>
}

/** The "serverless function": answers by path, records every request. */
const startFunction = () =>
  Effect.acquireRelease(
    Effect.callback<{ server: Server; url: string; seen: Array<Seen> }>((resume) => {
      const seen: Array<Seen> = []
      const server = createServer((req, res) => {
        let text = ""
        req.on("data", (c) => (text += c))
        req.on("end", () => {
          seen.push({ path: req.url ?? "", headers: req.headers, body: JSON.parse(text || "{}") })
          const status = Number(/\/(\d{3})$/.exec(req.url ?? "")?.[1] ?? 200)
          res.writeHead(status, status === 302 ? { location: "/elsewhere" } : {}).end("{}")
        })
      })
      server.listen(0, "127.0.0.1", () => {
        const { port } = server.address() as AddressInfo
        resume(Effect.succeed({ server, url: `http://127.0.0.1:${port}`, seen }))
      })
    }),
    ({ server }) => Effect.callback<void>((resume) => void server.close(() => resume(Effect.void)))
  )

/** A free loopback port for the receiver. */
const freePort = Effect.callback<number>((resume) => {
  const s = createServer()
  s.listen(0, "127.0.0.1", () => {
    const { port } = s.address() as AddressInfo
    s.close(() => resume(Effect.succeed(port)))
  })
})

const AwaLive = Awa.layerPg().pipe(Layer.provideMerge(TestDatabase.layer({ maxConnections: 12 })))

const fastMaintenance = {
  electionInterval: "50 millis",
  promoteInterval: "20 millis",
  rescueInterval: "200 millis"
} as const

const stateOf = (id: bigint) =>
  Effect.gen(function* () {
    const storage = yield* QueueStorage
    return (yield* storage.getJob(id)).state
  })

const waitState = (id: bigint, states: ReadonlyArray<JobState>) =>
  Effect.gen(function* () {
    for (let i = 0; i < 800; i++) {
      const s = yield* stateOf(id)
      if (states.includes(s)) return s
      yield* Effect.sleep("25 millis")
    }
    return yield* Effect.die(new Error(`job ${id} never reached ${states.join("/")}`))
  })

const post = (url: string, body: unknown, headers: Record<string, string> = {}) =>
  Effect.promise(async () => {
    const r = await fetch(url, {
      method: "POST",
      headers: { "content-type": "application/json", ...headers },
      body: JSON.stringify(body)
    })
    return {
      status: r.status,
      body: (await r.json().catch(() => null)) as Record<string, unknown> | null,
      headers: r.headers
    }
  })

describe("HTTP worker and callback receiver", () => {
  it("callback URLs: default, custom and empty prefixes; trailing slashes", () => {
    assert.strictEqual(
      HttpWorker.callbackUrl("https://h.example/", undefined, "1.2.ab"),
      "https://h.example/api/callbacks/1.2.ab"
    )
    assert.strictEqual(
      HttpWorker.callbackUrl("https://h.example", "hooks/", "x"),
      "https://h.example/hooks/x"
    )
    assert.strictEqual(HttpWorker.callbackUrl("https://h.example//", "", "x"), "https://h.example/x")
    assert.strictEqual(CallbackRoutes.normalizePrefix("hooks/"), "/hooks")
    assert.strictEqual(CallbackRoutes.normalizePrefix(""), "")
  })

  it("status mapping: 2xx success, 5xx retryable, others terminal", () => {
    assert.deepStrictEqual([200, 202, 204, 301, 302, 400, 404, 429, 500, 503].map(HttpWorker.classify), [
      "success",
      "success",
      "success",
      "terminal",
      "terminal",
      "terminal",
      "terminal",
      "terminal",
      "retryable",
      "retryable"
    ])
  })

  it("invalid options fail at startup with AwaConfigError naming each field", () => {
    try {
      Awa.httpWorker("k", { url: "not a url", mode: "async", signingSecret: "short" })
      assert.fail("expected AwaConfigError")
    } catch (e) {
      assert.instanceOf(e, AwaConfigError)
      assert.deepStrictEqual(
        (e as AwaConfigError).issues.map((i) => i.path),
        ["url", "callbackBaseUrl", "signingSecret"]
      )
    }
  })

  it.live(
    "sync: 200 completed, 500 retryable, 400 terminal, unreachable retryable, headers sent; async: 202 parks until the signed callback completes it, 503 retryable; the receiver refuses bad signatures",
    () =>
      Effect.gen(function* () {
        const fn = yield* startFunction()
        const port = yield* freePort
        const base = `http://127.0.0.1:${port}`
        const sync = (path: string) =>
          ({ url: `${fn.url}${path}`, mode: { sync: { responseTimeout: "5 seconds" } } }) as const
        const asyncOpts = (path: string) =>
          ({
            url: `${fn.url}${path}`,
            mode: "async",
            signingSecret: secret,
            callbackBaseUrl: base,
            queue: "http"
          }) as const
        const handlers = [
          Awa.httpWorker("sync_ok", { ...sync("/ok"), headers: { "x-tenant": "t1" }, queue: "http" }),
          Awa.httpWorker("sync_500", { ...sync("/500"), queue: "http" }),
          Awa.httpWorker("sync_400", { ...sync("/400"), queue: "http" }),
          Awa.httpWorker("sync_302", { ...sync("/302"), queue: "http" }),
          Awa.httpWorker("sync_down", {
            url: "http://127.0.0.1:1/",
            mode: { sync: { responseTimeout: "2 seconds" } },
            queue: "http"
          }),
          Awa.httpWorker("async_ok", asyncOpts("/accept/202")),
          Awa.httpWorker("async_503", asyncOpts("/busy/503"))
        ]
        yield* Effect.gen(function* () {
          const client = yield* AwaClient.AwaClient
          const insert = (kind: string) =>
            Effect.map(client.storage.enqueueMany([{ kind, queue: "http", args: { kind } }]), ([j]) => j!.id)
          const ids = {
            ok: yield* insert("sync_ok"),
            e500: yield* insert("sync_500"),
            e400: yield* insert("sync_400"),
            e302: yield* insert("sync_302"),
            down: yield* insert("sync_down"),
            parked: yield* insert("async_ok"),
            e503: yield* insert("async_503")
          }
          assert.strictEqual(yield* waitState(ids.ok, ["completed"]), "completed")
          assert.strictEqual(yield* waitState(ids.e500, ["retryable"]), "retryable")
          assert.strictEqual(yield* waitState(ids.e400, ["failed"]), "failed")
          assert.strictEqual(yield* waitState(ids.e302, ["failed"]), "failed")
          assert.strictEqual(yield* waitState(ids.down, ["retryable"]), "retryable")
          assert.strictEqual(yield* waitState(ids.e503, ["retryable"]), "retryable")
          const okReq = fn.seen.find((s) => s.path === "/ok")!
          assert.strictEqual(okReq.headers["x-tenant"], "t1")
          assert.deepStrictEqual(okReq.body, {
            jobId: String(ids.ok),
            kind: "sync_ok",
            args: { kind: "sync_ok" },
            attempt: 1,
            maxAttempts: 25
          })
          assert.isUndefined(okReq.headers[CallbackSignature.header])

          assert.strictEqual(yield* waitState(ids.parked, ["waiting_external"]), "waiting_external")
          const accepted = fn.seen.find((s) => s.path === "/accept/202")!
          const callbackId = accepted.body.callbackId as string
          const url = accepted.body.callbackUrl as string
          assert.strictEqual(url, `${base}/api/callbacks/${callbackId}`)
          const signature = accepted.headers[CallbackSignature.header] as string
          assert.strictEqual(signature, CallbackSignature.sign(key, callbackId))

          // refused: wrong secret, wrong id, malformed, empty, none
          const other = CallbackSignature.keyFromHex("08".repeat(32)) as CallbackSignature.SigningKey
          for (const bad of [
            CallbackSignature.sign(other, callbackId),
            CallbackSignature.sign(key, `${callbackId}x`),
            "abc",
            ""
          ]) {
            const r = yield* post(`${url}/complete`, {}, { [CallbackSignature.header]: bad })
            assert.strictEqual(r.status, 401, `signature ${JSON.stringify(bad)}`)
          }
          assert.strictEqual((yield* post(`${url}/complete`, {})).status, 401)
          assert.strictEqual(yield* stateOf(ids.parked), "waiting_external")
          // a well-signed unknown id: 404; a bad body: 400
          const unknown = `99999.1.${"0".repeat(32)}`
          assert.strictEqual(
            (yield* post(
              `${base}/api/callbacks/${unknown}/complete`,
              {},
              { [CallbackSignature.header]: CallbackSignature.sign(key, unknown) }
            )).status,
            404
          )
          assert.strictEqual(
            (yield* post(`${url}/fail`, { nope: 1 }, { [CallbackSignature.header]: signature })).status,
            400
          )
          // heartbeat, then complete
          const hb = yield* post(
            `${url}/heartbeat`,
            { timeoutSeconds: 600 },
            { [CallbackSignature.header]: signature }
          )
          assert.deepStrictEqual([hb.status, hb.body], [200, { id: callbackId, state: "waiting_external" }])
          const done = yield* post(
            `${url}/complete`,
            { payload: { ok: true } },
            { [CallbackSignature.header]: signature }
          )
          assert.deepStrictEqual([done.status, done.body], [200, { id: callbackId, state: "completed" }])
          assert.strictEqual(yield* stateOf(ids.parked), "completed")
          // a second callback is stale
          assert.strictEqual(
            (yield* post(`${url}/complete`, {}, { [CallbackSignature.header]: signature })).status,
            409
          )

          // the callback-only server has nothing else: no admin API, no dashboard, no CORS
          for (const path of ["/api/queues", "/api/jobs", "/dashboard", "/openapi.json", "/"]) {
            const r = yield* Effect.promise(() => fetch(`${base}${path}`))
            assert.strictEqual(r.status, 404, path)
          }
          const preflight = yield* Effect.promise(() =>
            fetch(`${url}/complete`, {
              method: "OPTIONS",
              headers: { origin: "https://evil.example", "access-control-request-method": "POST" }
            })
          )
          assert.isNull(preflight.headers.get("access-control-allow-origin"))
        }).pipe(
          Effect.provide(
            Layer.mergeAll(
              Awa.worker({
                queues: { http: { maxConcurrency: 10 } },
                handlers,
                maintenance: fastMaintenance
              }),
              CallbackRoutes.serve({ port, auth: { secret } })
            )
          )
        )
      }).pipe(Effect.scoped, Effect.provide(AwaLive)),
    90_000
  )

  it.live("mounting the routes without a secret fails unless unsigned is explicit", () =>
    Effect.gen(function* () {
      const port = yield* freePort
      const build = (auth: CallbackRoutes.CallbackRoutesOptions["auth"]) =>
        Effect.exit(Effect.scoped(Layer.build(CallbackRoutes.serve({ port, auth }))))
      const missing = yield* build({ secret: "" })
      assert.isTrue(Exit.isFailure(missing))
      assert.match(String(Exit.isFailure(missing) ? missing.cause : ""), /AwaConfigError|signing secret/)
      const short = yield* build({ secret: "abcd" })
      assert.isTrue(Exit.isFailure(short))
      assert.isTrue(Exit.isSuccess(yield* build({ unsigned: true })))
    }).pipe(Effect.provide(AwaLive))
  )
})
