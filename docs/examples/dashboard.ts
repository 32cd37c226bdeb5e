/**
 * The web dashboard beside the admin API (guide, "The dashboard"): open
 * http://127.0.0.1:3000/dashboard. Type-checked with the rest of the examples.
 */
import { createServer } from "node:http"
import { Admin } from "@awa/effect"
import * as AdminApi from "@awa/effect/admin-api"
import * as Dashboard from "@awa/effect/dashboard"
import { NodeHttpServer } from "@effect/platform-node"
import { Layer, Redacted } from "effect"
import { HttpRouter } from "effect/http"

const options = { token: Redacted.make(process.env.AWA_ADMIN_TOKEN ?? "") }

/** The API and the dashboard on one origin, over the application's Awa layers. */
export const adminServer = HttpRouter.serve(
  Layer.mergeAll(
    AdminApi.layer(options),
    Dashboard.layer({ ...options, traceLinkTemplate: "https://tempo.example.com/trace/{traceId}" })
  )
).pipe(
  Layer.provide(NodeHttpServer.layer(createServer, { port: 3000, host: "127.0.0.1" })),
  Layer.provide(Admin.layer())
)
