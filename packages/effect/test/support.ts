/**
 * Helpers shared by the operator-surface tests (AdminApi, Cli, Dashboard): fresh names, a cron
 * schedule to seed, the admin API served in process, the CLI run in process with its output
 * captured, and HTTP against a server started on a port, waiting for a condition (never for time).
 */
import { randomUUID } from "node:crypto"
import { Admin } from "@awa/runtime"
import { CronStorage, LeaderLock, PgQueueStorage, type QueueStorage } from "@awa/storage"
import { TestDatabase } from "@awa/testing"
import { NodeHttpServer, NodeServices } from "@effect/platform-node"
import { PgClient } from "@effect/sql-pg"
import { Console, Effect, Layer, Redacted } from "effect"
import { HttpClient, HttpClientRequest, HttpRouter } from "effect/http"
import type { SqlClient } from "effect/sql"
import * as AdminApi from "../src/AdminApi.ts"
import * as Cli from "../src/Cli.ts"

/** `label-` and 8 random hex digits: each test's own queue and schedule names on a shared database. */
export const fresh = (label: string) => `${label}-${randomUUID().slice(0, 8)}`

/** A schedule declaration for `queue` (daily at 03:00 UTC, job kind `nightly`, unless overridden). */
export const cronDeclaration = (
  name: string,
  queue: string,
  overrides: {
    readonly expression?: string
    readonly timezone?: string
    readonly kind?: string
    readonly args?: unknown
  } = {}
): CronStorage.CronDeclaration => ({
  name,
  expression: overrides.expression ?? "0 3 * * *",
  timezone: overrides.timezone ?? "UTC",
  job: {
    kind: overrides.kind ?? "nightly",
    queue,
    args: overrides.args ?? {},
    priority: 2,
    maxAttempts: 25,
    tags: [],
    metadata: {}
  },
  missedFire: { _tag: "Coalesce" }
})

export interface Fetched {
  readonly status: number
  readonly body: string
}

/** `fetch` of `base + path` as an Effect; a refused connection is status 0. */
export const httpGet =
  (base: string) =>
  (path: string, init: RequestInit = {}): Effect.Effect<Fetched> =>
    Effect.promise(() =>
      fetch(`${base}${path}`, init).then(
        async (r) => ({ status: r.status, body: await r.text() }),
        () => ({ status: 0, body: "" })
      )
    )

/** Polls `get(path)` every 50 ms until `ok` holds for the answer; returns that answer. */
export const until = (
  get: (path: string) => Effect.Effect<Fetched>,
  path: string,
  ok: (answer: Fetched) => boolean
) =>
  Effect.gen(function* () {
    let answer = yield* get(path)
    while (!ok(answer)) {
      yield* Effect.sleep("50 millis")
      answer = yield* get(path)
    }
    return answer
  })

// ---------------------------------------------------------------------------------------------
// The admin API in process (NodeHttpServer.layerTest), called with its HttpClient

/** What a test body served by `withApi` may use. */
export type ApiServices =
  | Admin.Admin
  | HttpClient.HttpClient
  | QueueStorage
  | CronStorage.CronStorage
  | LeaderLock.LeaderLock
  | SqlClient.SqlClient

/** The API served over storage on `url`, with `options`; `extra` is built on the same pool and provided to it. */
const served = <X, XE>(
  url: string,
  options: AdminApi.AdminApiOptions,
  extra: Layer.Layer<X, XE, PgClient.PgClient>
) => {
  const storage = Layer.mergeAll(PgQueueStorage.layer(), CronStorage.layerPg(), LeaderLock.layerPg()).pipe(
    Layer.provideMerge(PgClient.layer({ url: Redacted.make(url), maxConnections: 6 }))
  )
  const admin = Admin.layer().pipe(Layer.provideMerge(storage))
  return HttpRouter.serve(AdminApi.layer(options), { disableListenLog: true, disableLogger: true }).pipe(
    Layer.provideMerge(NodeHttpServer.layerTest),
    Layer.provideMerge(Layer.provideMerge(extra, admin))
  )
}

/**
 * Runs `body` against the API served over a fresh database (migrated unless told otherwise).
 * `extra` (built on the API's pool) is provided to the API, e.g. a `Readiness`.
 */
export const withApi = <A, E, X = never, XE = never>(
  options: AdminApi.AdminApiOptions,
  body: Effect.Effect<A, E, ApiServices>,
  migrated = true,
  extra: Layer.Layer<X, XE, PgClient.PgClient> = Layer.empty as unknown as Layer.Layer<
    X,
    XE,
    PgClient.PgClient
  >
) =>
  Effect.scoped(
    Effect.flatMap(TestDatabase.acquire({ migrated }), ({ url }) =>
      body.pipe(Effect.provide(served(url, options, extra)))
    )
  )

export interface Reply {
  readonly status: number
  readonly body: any
}

/** One request to the served API, with a bearer token when given; the body parsed as JSON. */
export const send = (method: "GET" | "POST" | "DELETE", path: string, bearer?: string) =>
  Effect.gen(function* () {
    const client = yield* HttpClient.HttpClient
    let request = HttpClientRequest.make(method)(path)
    if (bearer !== undefined) request = HttpClientRequest.bearerToken(request, bearer)
    const response = yield* client.execute(request)
    const text = yield* response.text
    return { status: response.status, body: text === "" ? null : JSON.parse(text) } satisfies Reply
  })

/** A value in the API's JSON form (bigints as strings, dates as ISO text), to compare whole bodies. */
export const asJson = (value: unknown): unknown =>
  JSON.parse(JSON.stringify(value, (_k, v) => (typeof v === "bigint" ? v.toString() : v)))

// ---------------------------------------------------------------------------------------------
// The CLI in process (`Cli.run`, what bin/awa.ts runs), output captured

export interface Ran {
  readonly code: number
  readonly out: string
  readonly err: string
}

/** Runs `awa <args>` with `--database-url url`, capturing what it prints. */
export const awa = (url: string, ...args: ReadonlyArray<string>) =>
  Effect.gen(function* () {
    const out: Array<string> = []
    const err: Array<string> = []
    const capture: Console.Console = {
      ...globalThis.console,
      log: (...a: ReadonlyArray<unknown>) => void out.push(a.map(String).join(" ")),
      error: (...a: ReadonlyArray<unknown>) => void err.push(a.map(String).join(" "))
    }
    const code = yield* Cli.run(["--database-url", url, ...args]).pipe(
      Effect.provideService(Console.Console, capture),
      Effect.provide(NodeServices.layer)
    )
    return { code, out: out.join("\n"), err: err.join("\n") } satisfies Ran
  })

export const json = (ran: Ran) => JSON.parse(ran.out) as Record<string, any>

/** Storage (queue and cron) on `url`, for seeding what the commands then read and change. */
const storageOn = (url: string) =>
  Layer.mergeAll(PgQueueStorage.layer(), CronStorage.layerPg()).pipe(
    Layer.provideMerge(PgClient.layer({ url: Redacted.make(url), maxConnections: 2 }))
  )

/** Runs `body` with a fresh database's URL and storage on it (migrated unless told otherwise). */
export const withDatabase = <A, E>(
  body: (url: string) => Effect.Effect<A, E, QueueStorage | CronStorage.CronStorage | SqlClient.SqlClient>,
  migrated = true
) =>
  Effect.scoped(
    Effect.flatMap(TestDatabase.acquire({ migrated }), ({ url }) =>
      body(url).pipe(Effect.provide(storageOn(url)))
    )
  )
