/**
 * Dashboard benchmark (issue 19): what one refresh of the dashboard's overview costs with N jobs
 * stored over Q queues. The overview page polls four admin API reads at once:
 * `GET /api/queues?window=3600`, `GET /api/queues/history` (the sparklines, over an hour of the
 * leader's samples taken first), `GET /api/status` and `GET /api/doctor`; this times each of them
 * and the four together (as the page issues them), over HTTP from the admin server
 * (`AdminApi.layer` + `Dashboard.layer` on `NodeHttpServer`) to Postgres, plus the page itself
 * and the cron read.
 *
 *   node bench/src/dashboard.ts --jobs 1000000 --queues 100
 *
 * Data, through the storage layer's own paths: N - backlog - 1,700 jobs enqueued, claimed and
 * completed in rounds of 10,000 spread over the Q queues, each round followed by rotate, prune
 * (retention 1 day: completed jobs stay stored in the history ring) and trimLedgers, as the
 * leader does; then `backlog` (default 10,000) jobs left available over the queues, 1,000
 * scheduled, 500 dead-lettered and 200 running. Each read is called 20 times after 3 warm-ups.
 * Postgres: `DATABASE_URL` or an embedded server (durable); a fresh database, dropped at the end.
 * Output: a table, and `bench/results/dashboard-latest.json`. No thresholds (docs/benchmarks.md).
 */
import { mkdirSync, writeFileSync } from "node:fs"
import { createServer } from "node:http"
import os from "node:os"
import * as AdminApi from "@awa/effect/admin-api"
import * as Dashboard from "@awa/effect/dashboard"
import { Admin } from "@awa/runtime"
import { Migrations } from "@awa/sql"
import { CronStorage, LeaderLock, PgQueueStorage, QueueStorage } from "@awa/storage"
import { NodeHttpServer, NodeRuntime } from "@effect/platform-node"
import { PgClient } from "@effect/sql-pg"
import { Console, Effect, Layer, Redacted } from "effect"
import { HttpRouter, HttpServer } from "effect/http"
import { Reactivity } from "effect/reactivity"
import {
  acquireServer,
  addOpenWork,
  createDatabase,
  databaseName,
  dropDatabase,
  fillHistory,
  intArg,
  loadLine,
  now,
  table,
  timeCalls as time
} from "./lib.ts"

const resultsFile = new URL("../results/dashboard-latest.json", import.meta.url)

const queueCount = intArg("--queues", 100)
const queues = Array.from({ length: queueCount }, (_, i) => `dash-${String(i).padStart(3, "0")}`)

const fetchOk = (url: string) =>
  Effect.promise(async () => {
    const response = await fetch(url)
    const body = await response.text()
    if (!response.ok) throw new Error(`${url}: ${response.status} ${body}`)
    return body.length
  })

const program = Effect.gen(function* () {
  const jobs = intArg("--jobs", 10_000)
  const backlog = Math.min(jobs, intArg("--backlog", Math.min(10_000, Math.floor(jobs / 10))))
  const server = yield* acquireServer
  const name = databaseName("awa_dash")
  const url = yield* createDatabase(server.url, name)
  yield* Effect.addFinalizer(() => dropDatabase(server.url, name))
  const client = PgClient.layer({ url: Redacted.make(url), maxConnections: 4 })
  yield* Migrations.migrate().pipe(Effect.provide(client))
  const storage = Layer.mergeAll(PgQueueStorage.layer(), CronStorage.layerPg(), LeaderLock.layerPg()).pipe(
    Layer.provideMerge(client)
  )
  yield* Console.log(`dashboard benchmark: ${jobs} jobs over ${queueCount} queues, database ${name}`)
  const t0 = now()
  yield* fillHistory(queues, "dash", Math.max(0, jobs - backlog - 1700)).pipe(Effect.provide(storage))
  yield* addOpenWork(queues, "dash", "dash-dlq", backlog).pipe(Effect.provide(storage))
  // an hour of the leader's samples (default period 15 s), for the sparklines' read
  yield* Effect.flatMap(QueueStorage, (s) =>
    Effect.repeat(s.sampleQueueStats({ minIntervalMs: 0, keepMs: 7_200_000 }), { times: 239 })
  ).pipe(Effect.provide(storage))
  const fillSeconds = (now() - t0) / 1000
  yield* Effect.flatMap(PgClient.PgClient, (sql) => Effect.ignore(sql`VACUUM ANALYZE`)).pipe(
    Effect.provide(client)
  )

  const options = { token: Redacted.make("bench") }
  const app = HttpRouter.serve(Layer.mergeAll(AdminApi.layer(options), Dashboard.layer(options)), {
    disableListenLog: true,
    disableLogger: true
  }).pipe(
    Layer.provideMerge(NodeHttpServer.layer(createServer, { port: 0, host: "127.0.0.1" })),
    Layer.provideMerge(Admin.layer().pipe(Layer.provideMerge(storage)))
  )
  const reads = yield* Effect.gen(function* () {
    const base = HttpServer.formatAddress((yield* HttpServer.HttpServer).address)
    const get = (path: string) => fetchOk(`${base}${path}`)
    const overview = Effect.all(
      [get("/api/queues?window=3600"), get("/api/queues/history"), get("/api/status"), get("/api/doctor")],
      { concurrency: "unbounded" }
    )
    return [
      ["overview refresh (the 4 reads at once)", yield* time(overview)],
      ["GET /api/queues?window=3600", yield* time(get("/api/queues?window=3600"))],
      ["GET /api/queues/history", yield* time(get("/api/queues/history"))],
      ["GET /api/status", yield* time(get("/api/status"))],
      ["GET /api/doctor", yield* time(get("/api/doctor"))],
      ["GET /dashboard/api/cron", yield* time(get("/dashboard/api/cron"))],
      ["GET /dashboard (the page)", yield* time(get("/dashboard"))]
    ] as const
  }).pipe(Effect.provide(app))

  yield* Console.log(
    `\n${jobs} jobs, ${queueCount} queues (filled in ${fillSeconds.toFixed(0)} s); load ${loadLine()}\n` +
      table(
        ["read", "p50 ms", "p95 ms", "max ms"],
        reads.map(([label, c]) => [label, c.p50Ms, c.p95Ms, c.maxMs])
      )
  )
  const cpus = os.cpus()
  mkdirSync(new URL(".", resultsFile), { recursive: true })
  writeFileSync(
    resultsFile,
    `${JSON.stringify(
      {
        startedAt: new Date().toISOString(),
        jobs,
        queues: queueCount,
        backlog,
        fillSeconds,
        machine: {
          cpus: cpus.length,
          cpuModel: cpus[0]?.model ?? "unknown",
          load: loadLine(),
          node: process.version
        },
        database: server.started ? "embedded" : "DATABASE_URL",
        reads: Object.fromEntries(reads.map(([label, c]) => [label, c]))
      },
      null,
      2
    )}\n`
  )
}).pipe(Effect.scoped, Effect.provide(Reactivity.layer))

NodeRuntime.runMain(program)
