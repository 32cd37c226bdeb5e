/**
 * The callback receiver (capabilities.md §18; docs/adr/0030-callbacks.md): where external
 * systems and HTTP-worker functions resolve callbacks. Two ways to host it:
 *
 * - `layer(options)`: the routes on your own Effect `HttpRouter` app (needs `Callbacks`, which
 *   `Awa.layerPg` provides);
 * - `serve(options)`: a standalone callback-only server — these routes and nothing else: no admin
 *   routes, no dashboard or static assets, no CORS headers (a browser on another origin cannot
 *   call it).
 *
 * Routes (default prefix `/api/callbacks`), each `POST`, JSON body, answer `{ id, state }`:
 *   `…/:id/complete` `{ payload? }`, `…/:id/fail` `{ error }`, `…/:id/heartbeat`
 *   `{ timeoutSeconds = 3600 }`, `…/:id/resume` `{ payload? }`.
 * Auth: `x-awa-signature` required (`CallbackSignature`: id-only, or `strict: true` binding id,
 * action, body digest and `x-awa-timestamp` within ±300 s). Mounting without a secret fails with
 * `AwaConfigError` unless `{ unsigned: true }` is explicit.
 * Errors: bad or missing signature 401, invalid body 400, unknown callback 404, stale callback or
 * retry of an attempt that is not parked 409, `readOnly` 503 (storage errors 503 too).
 */

import { createServer } from "node:http"
import { AwaConfigError, CallbackSignature } from "@awa/core"
import { Callbacks } from "@awa/runtime"
import { NodeHttpServer } from "@effect/platform-node"
import { Clock, Effect, Layer, Redacted, Schema } from "effect"
import { HttpRouter, HttpServerRequest, HttpServerResponse } from "effect/http"

export interface CallbackRoutesOptions {
  /** The signing secret (32 bytes as 64 hex characters), or an explicit opt-out. */
  readonly auth: { readonly secret: string | Redacted.Redacted<string> } | { readonly unsigned: true }
  /** Default `/api/callbacks`; a leading `/` is added, a trailing one removed; may be empty. */
  readonly pathPrefix?: string | undefined
  /** Require the strict signature (callers that hold the secret). Default false. */
  readonly strict?: boolean | undefined
  /** Refuse every callback with 503 (a read-only deployment). Default false. */
  readonly readOnly?: boolean | undefined
}

/** `/api/callbacks` → `/api/callbacks`; `api/callbacks/` → `/api/callbacks`; `""` or `/` → `""`. */
export const normalizePrefix = (prefix: string | undefined): string => {
  const p = (prefix ?? "/api/callbacks").replace(/\/+$/, "")
  return p === "" ? "" : p.startsWith("/") ? p : `/${p}`
}

const actions = ["complete", "fail", "heartbeat", "resume"] as const
type Action = (typeof actions)[number]

const CompleteBody = Schema.Struct({ payload: Schema.optional(Schema.Unknown) })
const FailBody = Schema.Struct({ error: Schema.String })
const HeartbeatBody = Schema.Struct({ timeoutSeconds: Schema.optional(Schema.Number) })

const json = (body: unknown, status = 200) => HttpServerResponse.jsonUnsafe(body, { status })
const problem = (status: number, tag: string, message: string) => json({ _tag: tag, message }, status)

/** The key, or the configuration error; `undefined` for an explicit `unsigned: true`. */
const keyOf = (auth: CallbackRoutesOptions["auth"] | undefined) => {
  if (auth !== undefined && "unsigned" in auth && auth.unsigned === true) return undefined
  const secret = auth !== undefined && "secret" in auth ? auth.secret : undefined
  if (secret === undefined || secret === "")
    return new AwaConfigError({
      issues: [
        { path: "auth", reason: "callback routes need a signing secret, or `unsigned: true` to opt out" }
      ]
    })
  return CallbackSignature.keyFromHex(
    Redacted.isRedacted(secret) ? Redacted.value(secret) : secret,
    "auth.secret"
  )
}

const parseBody = (text: string): unknown | undefined => {
  if (text.trim() === "") return {}
  try {
    return JSON.parse(text)
  } catch {
    return undefined
  }
}

/** The callback routes on the application's `HttpRouter`. */
export const layer = (
  options: CallbackRoutesOptions
): Layer.Layer<never, AwaConfigError, HttpRouter.HttpRouter | Callbacks.Callbacks> =>
  Layer.effectDiscard(
    Effect.gen(function* () {
      const key = keyOf(options.auth)
      if (key instanceof AwaConfigError) return yield* key
      const callbacks = yield* Callbacks.Callbacks
      const router = yield* HttpRouter.HttpRouter
      const prefix = normalizePrefix(options.pathPrefix)

      const handle = (action: Action) =>
        Effect.gen(function* () {
          const request = yield* HttpServerRequest.HttpServerRequest
          const params = yield* HttpRouter.params
          const id = params.id ?? ""
          if (options.readOnly === true) return problem(503, "ReadOnly", "callbacks are refused: read-only")
          const text = yield* Effect.orElseSucceed(request.text, () => undefined)
          if (text === undefined) return problem(400, "BadRequest", "unreadable body")
          if (key !== undefined) {
            const signature = request.headers[CallbackSignature.header]
            const bad =
              options.strict === true
                ? CallbackSignature.verifyStrict(
                    key,
                    {
                      callbackId: id,
                      action,
                      body: text,
                      signature,
                      timestamp: request.headers[CallbackSignature.timestampHeader]
                    },
                    Math.floor((yield* Clock.currentTimeMillis) / 1000)
                  )
                : CallbackSignature.verify(key, id, signature)
            if (bad !== undefined) return problem(401, "InvalidSignature", bad.message)
          }
          const body = parseBody(text)
          if (body === undefined || typeof body !== "object" || body === null || Array.isArray(body))
            return problem(400, "BadRequest", "body must be a JSON object")
          const decoded = yield* Effect.result(
            action === "fail"
              ? Effect.map(Schema.decodeUnknownEffect(FailBody)(body), (b) =>
                  callbacks.failExternal(id, b.error)
                )
              : action === "heartbeat"
                ? Effect.map(Schema.decodeUnknownEffect(HeartbeatBody)(body), (b) =>
                    callbacks.heartbeatCallback(id, `${b.timeoutSeconds ?? 3600} seconds`)
                  )
                : Effect.map(Schema.decodeUnknownEffect(CompleteBody)(body), (b) =>
                    action === "complete"
                      ? callbacks.completeExternal(id, b.payload)
                      : callbacks.resumeExternal(id, b.payload ?? null)
                  )
          )
          if (decoded._tag === "Failure") return problem(400, "BadRequest", decoded.failure.message)
          return yield* decoded.success.pipe(
            Effect.map((r) => json({ id, state: r.state })),
            Effect.catch((error) => {
              switch (error._tag) {
                case "CallbackNotFound":
                  return Effect.succeed(problem(404, error._tag, error.message))
                case "CallbackStale":
                case "InvalidTransition":
                  return Effect.succeed(problem(409, error._tag, error.message))
                case "ValidationError":
                  return Effect.succeed(problem(400, "BadRequest", error.message))
                default:
                  return Effect.as(
                    Effect.logWarning("callback resolution failed", error),
                    problem(503, "Unavailable", "callback storage unavailable; try again")
                  )
              }
            })
          )
        })

      for (const action of actions)
        yield* router.add("POST", `${prefix}/:id/${action}` as HttpRouter.PathInput, handle(action))
    })
  )

export interface CallbackServerOptions extends CallbackRoutesOptions {
  readonly port: number
  /** Default `127.0.0.1`. */
  readonly host?: string | undefined
}

/** A standalone server with the callback routes only; needs `Callbacks`. */
export const serve = (options: CallbackServerOptions) =>
  HttpRouter.serve(layer(options), { disableLogger: true }).pipe(
    Layer.provide(
      NodeHttpServer.layer(createServer, { port: options.port, host: options.host ?? "127.0.0.1" })
    )
  )
