/**
 * The web dashboard (issue 19, capabilities.md §29): static pages over the admin HTTP API
 * (`AdminApi.ts`), served from this package with no build step, no CDN, working offline. Mount
 * `layer(options)` beside `AdminApi.layer(options)` in the same `HttpRouter` app (same origin:
 * the pages call `/api/...`), then open `/dashboard/`.
 *
 * The page polls the API every `pollIntervalMs`; actions send the admin token the operator
 * entered (kept in the tab's sessionStorage), so the API's own checks (bearer token, read-only)
 * are the only gate. One read of its own: `GET /dashboard/api/cron`, the schedules with their next
 * fire time (`Cron.list`), which `/api/cron` does not compute; it follows `authReads` as the API's
 * reads do (docs/adr/0026-dashboard.md).
 */
import { Cron } from "@awa/runtime"
import { CronStorage } from "@awa/storage"
import { Effect, Layer, Redacted } from "effect"
import { HttpRouter, HttpServerRequest, HttpServerResponse } from "effect/http"
import type { AdminApiOptions } from "./AdminApi.ts"
import * as Assets from "./dashboard/assets.generated.ts"

export interface DashboardOptions extends Pick<AdminApiOptions, "token" | "authReads"> {
  /** Where the pages live. Default `/dashboard`. */
  readonly path?: `/${string}` | undefined
  /** How often an open page re-reads the API. Default 5,000 ms. */
  readonly pollIntervalMs?: number | undefined
  /**
   * A link to your tracing backend for a job's trace id, `{traceId}` replaced, e.g.
   * `https://tempo.example.com/trace/{traceId}`. Without it the trace id is shown as text.
   */
  readonly traceLinkTemplate?: string | undefined
}

const bearerOf = (header: string | undefined = "") =>
  header.toLowerCase().startsWith("bearer ") ? header.slice(7).trim() : undefined

const jsonReplacer = (_key: string, value: unknown) => (typeof value === "bigint" ? value.toString() : value)
const json = (value: unknown, status = 200) =>
  HttpServerResponse.text(JSON.stringify(value, jsonReplacer), {
    status,
    contentType: "application/json; charset=utf-8"
  })

/** The dashboard's routes on the application's `HttpRouter`. Needs `CronStorage` (for next fires). */
export const layer = (
  options: DashboardOptions = {}
): Layer.Layer<never, never, HttpRouter.HttpRouter | CronStorage.CronStorage> =>
  Layer.effectDiscard(
    Effect.gen(function* () {
      const router = yield* HttpRouter.HttpRouter
      const cronStorage = yield* CronStorage.CronStorage
      const base = options.path ?? "/dashboard"
      const config = JSON.stringify({
        apiBase: "",
        pollIntervalMs: options.pollIntervalMs ?? 5000,
        traceLinkTemplate: options.traceLinkTemplate ?? null,
        cronPath: `${base}/api/cron`
      })
      // the page's URLs are absolute (it answers at `${base}` and `${base}/` alike)
      const page = Assets.indexHtml
        .replaceAll("{{base}}", base)
        .replace('{"awa":"config"}', config.replaceAll("<", "\\u003c"))
      // assets never change for a given package version; the page itself must not be cached
      // stale across upgrades, so nothing is cached long
      const asset = (body: string, contentType: string) =>
        Effect.succeed(
          HttpServerResponse.text(body, { contentType, headers: { "cache-control": "no-cache" } })
        )
      yield* router.add("GET", base, asset(page, "text/html; charset=utf-8"))
      yield* router.add("GET", `${base}/app.css`, asset(Assets.appCss, "text/css; charset=utf-8"))
      yield* router.add("GET", `${base}/app.js`, asset(Assets.appJs, "text/javascript; charset=utf-8"))
      yield* router.add(
        "GET",
        `${base}/api/cron`,
        Effect.gen(function* () {
          const request = yield* HttpServerRequest.HttpServerRequest
          const given = bearerOf(request.headers.authorization)
          if (
            options.authReads === true &&
            (options.token === undefined || given !== Redacted.value(options.token))
          )
            return json({ _tag: "Unauthorized", message: "missing or wrong bearer token" }, 401)
          return yield* Cron.list.pipe(
            Effect.provideService(CronStorage.CronStorage, cronStorage),
            Effect.map((schedules) => json({ schedules })),
            Effect.catch((error) =>
              Effect.succeed(json({ _tag: "Unavailable", message: error.message }, 503))
            )
          )
        })
      )
    })
  )
