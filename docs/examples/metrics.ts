/**
 * Queue metrics out of an Effect application (guide, "Metrics"): Prometheus scrapes `/metrics`
 * on the admin server, or an OTLP collector receives them (and the traces) every 15 seconds.
 * Type-checked with the rest of the examples.
 */
import { createServer } from "node:http"
import { Admin } from "@awa/effect"
import * as AdminApi from "@awa/effect/admin-api"
import * as QueueMetrics from "@awa/effect/metrics"
import { NodeHttpServer } from "@effect/platform-node"
import { Layer, Redacted } from "effect"
import { FetchHttpClient, HttpRouter } from "effect/http"
import { Otlp, OtlpSerialization } from "effect/observability"

/** The admin API with `/metrics`, on port 9464, over the application's Awa layers. */
export const prometheus = HttpRouter.serve(
  AdminApi.layer({ token: Redacted.make(process.env.AWA_ADMIN_TOKEN ?? "") })
).pipe(
  Layer.provide(NodeHttpServer.layer(createServer, { port: 9464, host: "127.0.0.1" })),
  Layer.provide(Admin.layer())
)

/** Traces and metrics (the queue gauges collected every 15 s) to an OTLP/HTTP collector. */
export const otlp = Layer.mergeAll(
  QueueMetrics.layerPolling("15 seconds").pipe(Layer.provide(Admin.layer())),
  Otlp.layerJson({ baseUrl: "http://localhost:4318", resource: { serviceName: "my-worker" } })
).pipe(Layer.provide(FetchHttpClient.layer), Layer.provide(OtlpSerialization.layerJson))
