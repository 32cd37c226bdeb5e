/**
 * `Awa.httpWorker(kind, options)`: a handler that runs a job by calling an HTTP function
 * (capabilities.md §18; docs/adr/0030-callbacks.md).
 *
 * - Request: `POST url`, JSON `{ jobId, kind, args, attempt, maxAttempts }` (`jobId` as a decimal
 *   string), plus `callbackId` and `callbackUrl` in async mode, with `headers` and, in async
 *   mode, `x-awa-signature` (the callback's id-only signature: a capability token for that one
 *   callback, so the function needs no secret).
 * - Sync mode: 2xx ⇒ completed (body ignored). Async mode: the callback is registered before the
 *   request; 2xx ⇒ parked until the function calls `callbackUrl + "/complete" | "/fail" |
 *   "/heartbeat"` (the receiver, `CallbackRoutes`), or the callback times out.
 * - 5xx, a network error or a timeout ⇒ retryable (backoff, attempts counted); anything else
 *   (4xx, a 3xx, which is not followed) ⇒ terminal. No HTTP-level retry loop: the queue retries.
 * - A dispatcher process must be running (this is not scale-to-zero).
 * Invalid options throw `AwaConfigError` when the handler is made (at startup).
 */
import { AwaConfigError, CallbackSignature, Job } from "@awa/core"
import { Duration, Effect, Schema } from "effect"
import { type Handler, handler } from "./Handler.ts"

export interface HttpWorkerOptions {
  readonly url: string
  readonly mode: "async" | { readonly sync: { readonly responseTimeout: Duration.Input } }
  /** How long the function may take to call back (async). Default 1 hour (1 s – 30 days). */
  readonly callbackTimeout?: Duration.Input | undefined
  readonly headers?: Readonly<Record<string, string>> | undefined
  /** 32 bytes as 64 hex characters; required in async mode (signs the callback id). */
  readonly signingSecret?: string | undefined
  /** Where the function reaches the receiver; required in async mode. */
  readonly callbackBaseUrl?: string | undefined
  /** Default `/api/callbacks`; may be empty. */
  readonly callbackPathPrefix?: string | undefined
  /** Timeout of the request in async mode. Default 30 s. */
  readonly requestTimeout?: Duration.Input | undefined
  /** The queue the kind's jobs go to. Default `default`. */
  readonly queue?: string | undefined
}

/** `base` without a trailing `/`, the prefix with a leading `/` (or empty), then `/<id>`. */
export const callbackUrl = (base: string, prefix: string | undefined, callbackId: string): string => {
  const p = (prefix ?? "/api/callbacks").replace(/\/+$/, "")
  const path = p === "" ? "" : p.startsWith("/") ? p : `/${p}`
  return `${base.replace(/\/+$/, "")}${path}/${encodeURIComponent(callbackId)}`
}

const msOf = (input: Duration.Input | undefined, fallback: number): number | undefined => {
  if (input === undefined) return fallback
  const d = Duration.fromInput(input)
  return d._tag === "None" ? undefined : Math.round(Duration.toMillis(d.value))
}

export type StatusClass = "success" | "retryable" | "terminal"

/** §18's status mapping. */
export const classify = (status: number): StatusClass =>
  status >= 200 && status < 300 ? "success" : status >= 500 && status < 600 ? "retryable" : "terminal"

/** The job definition of an HTTP-worker kind: args are passed through as JSON. */
export const definition = (kind: string, queue?: string) =>
  Job.define({ kind, args: Schema.Unknown, ...(queue === undefined ? {} : { queue }) })

export const make = (kind: string, options: HttpWorkerOptions): Handler<never> => {
  const issues: Array<{ path: string; reason: string }> = []
  try {
    new URL(options.url)
  } catch {
    issues.push({ path: "url", reason: "must be an absolute URL" })
  }
  const isAsync = options.mode === "async"
  const timeoutMs = isAsync
    ? msOf(options.requestTimeout, 30_000)
    : msOf((options.mode as { sync: { responseTimeout: Duration.Input } }).sync?.responseTimeout, 30_000)
  if (timeoutMs === undefined || timeoutMs < 1)
    issues.push({ path: "timeout", reason: "must be a positive duration" })
  const callbackTimeoutMs = msOf(options.callbackTimeout, 3_600_000)
  if (callbackTimeoutMs === undefined || callbackTimeoutMs < 1000 || callbackTimeoutMs > 30 * 86_400_000)
    issues.push({ path: "callbackTimeout", reason: "must be 1 s – 30 days" })
  let key: CallbackSignature.SigningKey | undefined
  if (isAsync) {
    if (options.callbackBaseUrl === undefined)
      issues.push({ path: "callbackBaseUrl", reason: "is required in async mode" })
    const parsed =
      options.signingSecret === undefined
        ? new AwaConfigError({ issues: [{ path: "signingSecret", reason: "is required in async mode" }] })
        : CallbackSignature.keyFromHex(options.signingSecret)
    if (parsed instanceof AwaConfigError) issues.push(...parsed.issues)
    else key = parsed
  }
  if (issues.length > 0) throw new AwaConfigError({ issues })

  return handler(definition(kind, options.queue), (args, ctx) =>
    Effect.gen(function* () {
      const job = {
        jobId: String(ctx.job.id),
        kind,
        args,
        attempt: ctx.job.attempt,
        maxAttempts: ctx.job.maxAttempts
      }
      const headers: Record<string, string> = { "content-type": "application/json", ...options.headers }
      let body: Record<string, unknown> = job
      let token: Job.CallbackToken | undefined
      if (isAsync) {
        // registered before the request: the function may call back before we hear its answer
        token = yield* ctx.registerCallback({ timeout: callbackTimeoutMs! })
        headers[CallbackSignature.header] = CallbackSignature.sign(key!, token.id)
        body = {
          ...job,
          callbackId: token.id,
          callbackUrl: callbackUrl(options.callbackBaseUrl!, options.callbackPathPrefix, token.id)
        }
      }
      const status = yield* Effect.tryPromise({
        try: async (signal) => {
          const response = await fetch(options.url, {
            method: "POST",
            headers,
            body: JSON.stringify(body),
            redirect: "manual",
            signal: AbortSignal.any([signal, AbortSignal.timeout(timeoutMs!)])
          })
          // drain it: the connection goes back to the pool
          await response.arrayBuffer().catch(() => undefined)
          return response.status
        },
        catch: (error) =>
          new Job.JobRetryableError({
            message: `HTTP worker: request failed: ${error instanceof Error ? error.message : String(error)}`,
            cause: error
          })
      })
      switch (classify(status)) {
        case "success":
          return token === undefined ? Job.JobResult.completed : Job.JobResult.waitForCallback(token)
        case "retryable":
          return yield* new Job.JobRetryableError({ message: `HTTP worker: function answered ${status}` })
        case "terminal":
          return yield* new Job.JobTerminalError({ message: `HTTP worker: function answered ${status}` })
      }
    })
  )
}
