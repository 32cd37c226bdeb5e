/**
 * The admin HTTP API (issue 18, capabilities.md §29) on Effect's `HttpApi`: the `Admin`
 * service's reads and actions under `/api`, `/healthz`, `/readyz` and an OpenAPI document at
 * `/openapi.json`. Mount `layer(options)` in your own `HttpRouter` app, or run `awa serve`.
 *
 * Auth (docs/adr/0024-operator-surface.md): every action needs `Authorization: Bearer <token>`;
 * reads need it too when `authReads` is set. Without a token configured, actions are refused
 * (401) unless `insecureNoAuth`. `readOnly` answers 503 to every action, token or not. Bodies are
 * JSON with bigints as strings and dates as ISO text (the CLI's `--json` form).
 */
import { Admin, Callbacks } from "@awa/runtime"
import { Effect, Layer, Option, Redacted, Schema } from "effect"
import { HttpServerRequest } from "effect/http"
import {
  HttpApi,
  HttpApiBuilder,
  HttpApiEndpoint,
  HttpApiGroup,
  HttpApiMiddleware,
  HttpApiSecurity
} from "effect/http-api"
import { SqlClient } from "effect/sql"
import * as Bodies from "./AdminSchemas.ts"
import * as QueueMetrics from "./QueueMetrics.ts"
import * as Readiness from "./Readiness.ts"

export { Bodies, Readiness }

// ---------------------------------------------------------------------------------------------
// Errors (JSON bodies with a message)

export class BadRequest extends Schema.Error<BadRequest>("awa/admin/BadRequest")(
  { _tag: Schema.tag("BadRequest"), message: Schema.String },
  { httpApiStatus: 400 }
) {}
export class Unauthorized extends Schema.Error<Unauthorized>("awa/admin/Unauthorized")(
  { _tag: Schema.tag("Unauthorized"), message: Schema.String },
  { httpApiStatus: 401 }
) {}
export class NotFound extends Schema.Error<NotFound>("awa/admin/NotFound")(
  { _tag: Schema.tag("NotFound"), message: Schema.String },
  { httpApiStatus: 404 }
) {}
export class Conflict extends Schema.Error<Conflict>("awa/admin/Conflict")(
  { _tag: Schema.tag("Conflict"), message: Schema.String },
  { httpApiStatus: 409 }
) {}
export class Unavailable extends Schema.Error<Unavailable>("awa/admin/Unavailable")(
  { _tag: Schema.tag("Unavailable"), message: Schema.String },
  { httpApiStatus: 503 }
) {}

// ---------------------------------------------------------------------------------------------
// Middleware: bearer token for actions (and optionally reads), read-only mode

/** Actions: a bearer token, and refused in read-only mode. */
export class ActionAuth extends HttpApiMiddleware.Service<ActionAuth>()("awa/admin/ActionAuth", {
  error: [Unauthorized, Unavailable],
  security: { bearer: HttpApiSecurity.bearer }
}) {}

/** Reads: open, or the same bearer token when `authReads`. */
export class ReadAuth extends HttpApiMiddleware.Service<ReadAuth>()("awa/admin/ReadAuth", {
  error: Unauthorized
}) {}

// ---------------------------------------------------------------------------------------------
// The API

// waiting-job routes (issue 21) still answer untyped JSON
const Json = Schema.Unknown
const id = { id: Schema.String }
const errors = [BadRequest, NotFound, Conflict, Unavailable] as const

const reads = HttpApiGroup.make("reads")
  .add(
    HttpApiEndpoint.get("queues", "/api/queues", {
      query: { exact: Schema.optional(Schema.String), window: Schema.optional(Schema.String) },
      success: Bodies.QueueStatsReport,
      error: errors
    }),
    HttpApiEndpoint.get("queueHistory", "/api/queues/history", {
      query: { window: Schema.optional(Schema.String), bucket: Schema.optional(Schema.String) },
      success: Bodies.QueueHistoryReport,
      error: errors
    }),
    HttpApiEndpoint.get("status", "/api/status", { success: Bodies.StorageReport, error: errors }),
    HttpApiEndpoint.get("doctor", "/api/doctor", { success: Bodies.DoctorChecks, error: errors }),
    HttpApiEndpoint.get("capabilities", "/api/capabilities", { success: Bodies.Capabilities }),
    HttpApiEndpoint.get("jobs", "/api/jobs", {
      query: {
        queue: Schema.optional(Schema.String),
        kind: Schema.optional(Schema.String),
        state: Schema.optional(Schema.String),
        tag: Schema.optional(Schema.String),
        before: Schema.optional(Schema.String),
        createdAfter: Schema.optional(Schema.String),
        createdBefore: Schema.optional(Schema.String),
        finalizedAfter: Schema.optional(Schema.String),
        finalizedBefore: Schema.optional(Schema.String),
        limit: Schema.optional(Schema.String)
      },
      success: Schema.Array(Bodies.JobView),
      error: errors
    }),
    HttpApiEndpoint.get("job", "/api/jobs/:id", { params: id, success: Bodies.JobPage, error: errors }),
    HttpApiEndpoint.get("dlq", "/api/dlq", {
      query: {
        queue: Schema.optional(Schema.String),
        kind: Schema.optional(Schema.String),
        tag: Schema.optional(Schema.String),
        before: Schema.optional(Schema.String),
        limit: Schema.optional(Schema.String)
      },
      success: Schema.Array(Bodies.DlqEntry),
      error: errors
    }),
    HttpApiEndpoint.get("dlqEntry", "/api/dlq/:id", { params: id, success: Bodies.DlqEntry, error: errors }),
    HttpApiEndpoint.get("cron", "/api/cron", { success: Bodies.CronSnapshot, error: errors })
  )
  .middleware(ReadAuth)

const queueParam = { queue: Schema.String }
const nameParam = { name: Schema.String }

const actions = HttpApiGroup.make("actions")
  .add(
    HttpApiEndpoint.post("pauseQueue", "/api/queues/:queue/pause", {
      params: queueParam,
      success: Bodies.QueuePaused,
      error: errors
    }),
    HttpApiEndpoint.post("resumeQueue", "/api/queues/:queue/resume", {
      params: queueParam,
      success: Bodies.QueuePaused,
      error: errors
    }),
    HttpApiEndpoint.post("drainQueue", "/api/queues/:queue/drain", {
      params: queueParam,
      success: Bodies.QueueDrained,
      error: errors
    }),
    HttpApiEndpoint.post("retryJob", "/api/jobs/:id/retry", {
      params: id,
      success: Bodies.JobView,
      error: errors
    }),
    HttpApiEndpoint.post("cancelJob", "/api/jobs/:id/cancel", {
      params: id,
      success: Bodies.JobView,
      error: errors
    }),
    HttpApiEndpoint.post("retryDlq", "/api/dlq/:id/retry", {
      params: id,
      success: Bodies.JobView,
      error: errors
    }),
    HttpApiEndpoint.delete("purgeDlq", "/api/dlq/:id", { params: id, success: Bodies.Purged, error: errors }),
    HttpApiEndpoint.post("pauseCron", "/api/cron/:name/pause", {
      params: nameParam,
      success: Bodies.CronPaused,
      error: errors
    }),
    HttpApiEndpoint.post("resumeCron", "/api/cron/:name/resume", {
      params: nameParam,
      success: Bodies.CronPaused,
      error: errors
    }),
    HttpApiEndpoint.post("triggerCron", "/api/cron/:name/trigger", {
      params: nameParam,
      success: Bodies.Enqueued,
      error: errors
    })
  )
  .middleware(ActionAuth)

const health = HttpApiGroup.make("health").add(
  HttpApiEndpoint.get("healthz", "/healthz", { success: Bodies.Health, error: Unavailable }),
  HttpApiEndpoint.get("readyz", "/readyz", { success: Bodies.Ready, error: Unavailable })
)

// ---------------------------------------------------------------------------------------------
// Waiting jobs (issue 21, capabilities.md §17): an operator resolves, retries or fails a job that
// waits for its callback, by job id. Cancel is the ordinary cancelJob. Same auth as actions.

const WaitingBody = Schema.Struct({
  payload: Schema.optional(Schema.Unknown),
  error: Schema.optional(Schema.String)
})

const waiting = HttpApiGroup.make("waiting")
  .add(
    HttpApiEndpoint.post("resolveWaiting", "/api/jobs/:id/callback/:action", {
      params: { id: Schema.String, action: Schema.Literals(["complete", "fail", "retry", "resume"]) },
      payload: WaitingBody,
      success: Json,
      error: errors
    })
  )
  .middleware(ActionAuth)

/** The admin API's contract (also what `/openapi.json` describes). */
export const api = HttpApi.make("awa-admin").add(reads).add(actions).add(health).add(waiting)

// ---------------------------------------------------------------------------------------------
// Handlers

export interface AdminApiOptions {
  /** The bearer token actions (and, with `authReads`, reads) need. */
  readonly token?: Redacted.Redacted<string> | undefined
  /** Reads need the token too. */
  readonly authReads?: boolean | undefined
  /** Every action answers 503. */
  readonly readOnly?: boolean | undefined
  /** Without a token, let actions through (development only). */
  readonly insecureNoAuth?: boolean | undefined
}

const jsonReplacer = (_key: string, value: unknown) => (typeof value === "bigint" ? value.toString() : value)
/**
 * A value as the JSON it is sent as: bigints as strings, dates as ISO text. Typed as the route's
 * body (the JSON form `AdminSchemas` describes); the route's Schema checks it when encoding.
 */
const plain = <A = never>(value: unknown): A => JSON.parse(JSON.stringify(value ?? null, jsonReplacer))

/** Admin failures as HTTP errors; a database error is a 503 with its message. */
const toHttp = (error: { readonly _tag: string; readonly message?: string }) => {
  const message = error.message ?? error._tag
  switch (error._tag) {
    case "JobNotFound":
    case "CronNotFound":
      return new NotFound({ message })
    case "ValidationError":
    case "UnsafeBulkFilter":
    case "AwaConfigError":
      return new BadRequest({ message: `${error._tag}: ${message}` })
    case "UniqueConflict":
    case "InvalidTransition":
      return new Conflict({ message: `${error._tag}: ${message}` })
    default:
      return new Unavailable({ message: `${error._tag}: ${message}` })
  }
}

/** An Admin call as a route's answer: its value in JSON form (typed as `body`), failures as HTTP errors. */
const call = <S extends Schema.Top, A, E extends { readonly _tag: string; readonly message?: string }, R>(
  _body: S,
  effect: Effect.Effect<A, E, R>
) =>
  effect.pipe(
    Effect.map((a) => plain<S["Type"]>(a)),
    Effect.mapError(toHttp)
  )

/** An optional ISO-8601 instant from a query string. */
const parseInstant = (field: string, text: string | undefined) => {
  if (text === undefined || text === "") return Effect.succeed(undefined)
  const date = new Date(text)
  return Number.isNaN(date.getTime())
    ? Effect.fail(new BadRequest({ message: `${field} must be an ISO-8601 instant (got ${text})` }))
    : Effect.succeed(date)
}

const parseId = (text: string) =>
  /^[1-9][0-9]{0,18}$/.test(text)
    ? Effect.succeed(BigInt(text))
    : Effect.fail(new BadRequest({ message: `not a job id: ${text}` }))

const parseInt10 = (field: string, text: string | undefined) =>
  text === undefined
    ? Effect.succeed(undefined)
    : /^-?[0-9]{1,9}$/.test(text)
      ? Effect.succeed(Number(text))
      : Effect.fail(new BadRequest({ message: `${field} must be an integer (got ${text})` }))

const bearerOf = (header: string | undefined = "") =>
  header.toLowerCase().startsWith("bearer ") ? header.slice(7).trim() : undefined

const tokenMatches = (options: AdminApiOptions, given: string | undefined) =>
  options.token !== undefined && given !== undefined && given === Redacted.value(options.token)

const readsLive = (options: AdminApiOptions) =>
  HttpApiBuilder.group(api, "reads", (handlers) =>
    Effect.gen(function* () {
      const admin = yield* Admin.Admin
      return handlers
        .handle("queues", ({ query }) =>
          Effect.gen(function* () {
            const seconds = yield* parseInt10("window", query.window)
            return yield* call(
              Bodies.QueueStatsReport,
              admin.queueStats({
                exact: query.exact === "true",
                windowMs: seconds === undefined ? undefined : seconds * 1000
              })
            )
          })
        )
        .handle("queueHistory", ({ query }) =>
          Effect.gen(function* () {
            const window = yield* parseInt10("window", query.window)
            const bucket = yield* parseInt10("bucket", query.bucket)
            return yield* call(
              Bodies.QueueHistoryReport,
              admin.queueHistory({
                windowMs: window === undefined ? undefined : window * 1000,
                bucketMs: bucket === undefined ? undefined : bucket * 1000
              })
            )
          })
        )
        .handle("status", () => call(Bodies.StorageReport, admin.status))
        .handle("doctor", () => call(Bodies.DoctorChecks, admin.doctor))
        .handle("capabilities", () =>
          Effect.succeed({
            readOnly: options.readOnly === true,
            authReads: options.authReads === true,
            actions:
              options.readOnly !== true && (options.token !== undefined || options.insecureNoAuth === true)
          })
        )
        .handle("jobs", ({ query }) =>
          Effect.gen(function* () {
            const before = query.before === undefined ? undefined : yield* parseId(query.before)
            return yield* call(
              Schema.Array(Bodies.JobView),
              admin.listJobs({
                queue: query.queue,
                kind: query.kind,
                state: query.state as never,
                tag: query.tag,
                before,
                createdAfter: yield* parseInstant("createdAfter", query.createdAfter),
                createdBefore: yield* parseInstant("createdBefore", query.createdBefore),
                finalizedAfter: yield* parseInstant("finalizedAfter", query.finalizedAfter),
                finalizedBefore: yield* parseInstant("finalizedBefore", query.finalizedBefore),
                limit: yield* parseInt10("limit", query.limit)
              })
            )
          })
        )
        .handle("job", ({ params }) =>
          Effect.flatMap(parseId(params.id), (jobId) => call(Bodies.JobPage, admin.getJob(jobId)))
        )
        .handle("dlq", ({ query }) =>
          Effect.gen(function* () {
            const before = query.before === undefined ? undefined : yield* parseId(query.before)
            return yield* call(
              Schema.Array(Bodies.DlqEntry),
              admin.listDlq({
                queue: query.queue,
                kind: query.kind,
                tag: query.tag,
                before,
                limit: yield* parseInt10("limit", query.limit)
              })
            )
          })
        )
        .handle("dlqEntry", ({ params }) =>
          Effect.flatMap(parseId(params.id), (jobId) => call(Bodies.DlqEntry, admin.getDlq(jobId)))
        )
        .handle("cron", () => call(Bodies.CronSnapshot, admin.listCron))
    })
  )

const actionsLive = HttpApiBuilder.group(api, "actions", (handlers) =>
  Effect.gen(function* () {
    const admin = yield* Admin.Admin
    const withId = <S extends Schema.Top, A, E extends { readonly _tag: string; readonly message?: string }>(
      text: string,
      body: S,
      f: (id: bigint) => Effect.Effect<A, E>
    ) => Effect.flatMap(parseId(text), (jobId) => call(body, f(jobId)))
    return handlers
      .handle("pauseQueue", ({ params }) =>
        call(
          Bodies.QueuePaused,
          Effect.as(admin.pauseQueue(params.queue), { queue: params.queue, paused: true })
        )
      )
      .handle("resumeQueue", ({ params }) =>
        call(
          Bodies.QueuePaused,
          Effect.as(admin.resumeQueue(params.queue), { queue: params.queue, paused: false })
        )
      )
      .handle("drainQueue", ({ params }) =>
        call(
          Bodies.QueueDrained,
          Effect.map(admin.drainQueue(params.queue), (cancelled) => ({ queue: params.queue, cancelled }))
        )
      )
      .handle("retryJob", ({ params }) => withId(params.id, Bodies.JobView, admin.retryJob))
      .handle("cancelJob", ({ params }) =>
        withId(params.id, Bodies.JobView, (jobId) => admin.cancelJob(jobId))
      )
      .handle("retryDlq", ({ params }) => withId(params.id, Bodies.JobView, (jobId) => admin.retryDlq(jobId)))
      .handle("purgeDlq", ({ params }) =>
        withId(params.id, Bodies.Purged, (jobId) => Effect.as(admin.purgeDlq(jobId), { purged: 1 }))
      )
      .handle("pauseCron", ({ params }) =>
        call(Bodies.CronPaused, Effect.as(admin.pauseCron(params.name), { name: params.name, paused: true }))
      )
      .handle("resumeCron", ({ params }) =>
        call(
          Bodies.CronPaused,
          Effect.as(admin.resumeCron(params.name), { name: params.name, paused: false })
        )
      )
      .handle("triggerCron", ({ params }) => call(Bodies.Enqueued, admin.triggerCron(params.name)))
  })
)

// Readiness: the schema at this code's version, a leader holding its lock, and (with a
// `Readiness` service: `awa serve` provides one) this process's LISTEN confirmed and no shutdown
// begun. Without one, `listening` is reported as null (not checked).
const healthLive = HttpApiBuilder.group(api, "health", (handlers) =>
  Effect.gen(function* () {
    const admin = yield* Admin.Admin
    const sql = yield* SqlClient.SqlClient
    const readiness = yield* Effect.serviceOption(Readiness.Readiness)
    const unavailable = (message: string) => new Unavailable({ message })
    return handlers
      .handle("healthz", () =>
        sql`SELECT 1`.pipe(
          Effect.as({ status: "ok" as const, database: "reachable" as const }),
          Effect.mapError((e) => unavailable(`database unreachable: ${e.message}`))
        )
      )
      .handle("readyz", () =>
        Effect.gen(function* () {
          const state = Option.isSome(readiness) ? yield* readiness.value.state : undefined
          if (state?.shuttingDown === true) return yield* unavailable("shutting down")
          const report = yield* Effect.mapError(admin.status, (e) =>
            unavailable(`database unreachable: ${e.message}`)
          )
          if (report.schemaVersion !== report.latestVersion)
            return yield* unavailable(
              `schema at version ${report.schemaVersion}, this code needs ${report.latestVersion}`
            )
          if (report.leader === null) return yield* unavailable("no maintenance leader holds its lock")
          if (state !== undefined && !state.listening)
            return yield* unavailable("LISTEN not connected: this process receives no notifications")
          return {
            status: "ready" as const,
            schemaVersion: report.schemaVersion,
            leader: plain<typeof Bodies.Ready.Type.leader>(report.leader),
            listening: state === undefined ? null : state.listening
          }
        })
      )
  })
)

const waitingLive = HttpApiBuilder.group(api, "waiting", (handlers) =>
  Effect.gen(function* () {
    // optional, so mounting the admin API needs nothing new; `awa serve` provides it
    const found = yield* Effect.serviceOption(Callbacks.Callbacks)
    return handlers.handle("resolveWaiting", ({ params, payload }) =>
      Effect.flatMap(parseId(params.id), (jobId) =>
        found._tag === "None"
          ? Effect.fail(new Unavailable({ message: "callbacks are not available in this server" }))
          : found.value
              .resolveWaiting(
                jobId,
                params.action === "complete"
                  ? { _tag: "Complete" }
                  : params.action === "fail"
                    ? { _tag: "Fail", error: payload.error ?? "failed by operator" }
                    : params.action === "retry"
                      ? { _tag: "Retry" }
                      : { _tag: "Resume", payload: payload.payload ?? null }
              )
              .pipe(
                Effect.map(plain),
                Effect.mapError((error) =>
                  error._tag === "CallbackNotFound"
                    ? new NotFound({ message: error.message })
                    : error._tag === "CallbackStale"
                      ? new Conflict({ message: `${error._tag}: ${error.message}` })
                      : toHttp(error)
                )
              )
      )
    )
  })
)

const middlewareLive = (options: AdminApiOptions) =>
  Layer.mergeAll(
    Layer.succeed(ActionAuth, {
      bearer: (httpEffect, { credential }) => {
        if (options.readOnly === true)
          return Effect.fail(new Unavailable({ message: "read-only mode: actions are disabled" }))
        if (options.token === undefined && options.insecureNoAuth === true) return httpEffect
        if (options.token === undefined)
          return Effect.fail(new Unauthorized({ message: "no admin token configured: actions are disabled" }))
        return tokenMatches(options, Redacted.value(credential) || undefined)
          ? httpEffect
          : Effect.fail(new Unauthorized({ message: "missing or wrong bearer token" }))
      }
    }),
    Layer.succeed(ReadAuth, (httpEffect) =>
      Effect.andThen(
        Effect.flatMap(HttpServerRequest.HttpServerRequest, (request) =>
          options.authReads !== true || tokenMatches(options, bearerOf(request.headers.authorization))
            ? Effect.void
            : Effect.fail(new Unauthorized({ message: "missing or wrong bearer token" }))
        ),
        httpEffect
      )
    )
  )

/**
 * The admin API's routes for an `HttpRouter` (serve it with `HttpRouter.serve`), with the OpenAPI
 * document at `/openapi.json`. Needs the `Admin` service and its `SqlClient`; the waiting-job
 * actions also use `Callbacks` when it is provided (else they answer 503).
 */
export const layer = (options: AdminApiOptions = {}) =>
  Layer.mergeAll(
    HttpApiBuilder.layer(api, { openapiPath: "/openapi.json" }).pipe(
      Layer.provide(Layer.mergeAll(readsLive(options), actionsLive, healthLive, waitingLive)),
      Layer.provide(middlewareLive(options))
    ),
    // GET /metrics, Prometheus text (open, as /healthz: bind the server to a private address)
    QueueMetrics.layerPrometheus()
  )
