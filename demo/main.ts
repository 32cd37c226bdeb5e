/**
 * `npm start`: a worker demo on an embedded Postgres. It starts (or reuses) a PostgreSQL whose
 * data lives under `.awa/` in the checkout (`DATABASE_URL` points it elsewhere), applies Awa's
 * migrations, runs a worker with a few job kinds and a producer, and prints per-queue counts
 * every second until Ctrl-C, which drains the worker and stops the embedded server.
 */
import { fileURLToPath } from "node:url"
import { Job, type UniqueConflict } from "@awa/core"
import { Awa, AwaClient, Handler } from "@awa/runtime"
import { EmbeddedPostgres } from "@awa/testing"
import { NodeRuntime } from "@effect/platform-node"
import { Console, Effect, Layer, Random, Redacted, Schedule, Schema } from "effect"

const dataRoot = fileURLToPath(new URL("../.awa/", import.meta.url))

// --- job kinds -----------------------------------------------------------------------------

const SendWelcome = Job.define({
  kind: "send_welcome",
  args: Schema.Struct({ user: Schema.Number }),
  queue: "email"
})
const ChargeCard = Job.define({
  kind: "charge_card",
  args: Schema.Struct({ order: Schema.Number }),
  queue: "billing",
  backoff: () => "1 second"
})
const Reminder = Job.define({
  kind: "reminder",
  args: Schema.Struct({ user: Schema.Number }),
  queue: "email"
})
const ImportFile = Job.define({
  kind: "import_file",
  args: Schema.Struct({ file: Schema.String }),
  queue: "billing"
})
const DailyDigest = Job.define({
  kind: "daily_digest",
  args: Schema.Struct({ day: Schema.String }),
  queue: "email",
  defaults: { unique: { byArgs: true } }
})

const handlers = [
  Handler.handler(SendWelcome, () => Effect.sleep("50 millis")),
  // fails twice, then succeeds
  Handler.handler(ChargeCard, (_args, ctx) =>
    ctx.job.attempt < 3
      ? Effect.fail(new Job.JobRetryableError({ message: "card network timeout" }))
      : Effect.void
  ),
  // snoozes once for two seconds (the attempt is not counted: the second run is attempt 1 again,
  // with the next run lease), then completes
  Handler.handler(Reminder, (_args, ctx) =>
    Effect.succeed(ctx.job.runLease === 1n ? Job.JobResult.snooze("2 seconds") : Job.JobResult.completed)
  ),
  Handler.handler(ImportFile, ({ file }) =>
    Effect.fail(new Job.JobTerminalError({ message: `${file}: unsupported format` }))
  ),
  Handler.handler(DailyDigest, () => Effect.sleep("20 millis"))
]

// --- producer and progress -----------------------------------------------------------------

const produce = Effect.gen(function* () {
  const client = yield* AwaClient.AwaClient
  const n = yield* Random.nextIntBetween(1, 100_000)
  yield* client.insert(SendWelcome, { user: n })
  yield* client.insert(ChargeCard, { order: n })
  yield* client.insert(Reminder, { user: n })
  if (n % 5 === 0) yield* client.insert(ImportFile, { file: `upload-${n}.xls` })
  const day = new Date().toISOString().slice(0, 16)
  // one digest per minute: the unique key turns every other insert into a typed conflict
  yield* client.insert(DailyDigest, { day }).pipe(
    Effect.catchTag("UniqueConflict", (_: UniqueConflict) =>
      Effect.sync(() => {
        duplicatesRejected++
      })
    )
  )
})

let duplicatesRejected = 0

const report = Effect.gen(function* () {
  const client = yield* AwaClient.AwaClient
  const counts = yield* client.storage.countByQueueState
  const byQueue = new Map<string, Array<string>>()
  for (const c of counts) byQueue.set(c.queue, [...(byQueue.get(c.queue) ?? []), `${c.state} ${c.count}`])
  const line = [...byQueue.entries()].map(([q, states]) => `${q}: ${states.join(", ")}`).join(" | ")
  yield* Console.log(
    `[${new Date().toISOString().slice(11, 19)}] ${line} | duplicate digests rejected: ${duplicatesRejected}`
  )
})

// --- wiring --------------------------------------------------------------------------------

const server = Effect.acquireRelease(
  Effect.promise(() =>
    EmbeddedPostgres.resolve(process.env, () => EmbeddedPostgres.startPersistent(dataRoot))
  ),
  (s) =>
    Effect.promise(() => s.stop()).pipe(
      Effect.andThen(s.started ? Console.log("embedded Postgres stopped") : Effect.void)
    )
)

const program = Effect.gen(function* () {
  const pg = yield* server
  yield* Console.log(pg.dataDir ? `Postgres: embedded, data in ${pg.dataDir}` : "Postgres: DATABASE_URL")
  // Awa.pgClient: PgClient.layer whose connection errors name their cause on the first line
  const Database = Awa.pgClient({
    url: Redacted.make(pg.url),
    maxConnections: 10,
    applicationName: "awa-demo"
  })
  const AwaLive = Awa.layerPg({ migrateOnStart: true }).pipe(Layer.provideMerge(Database))
  const WorkerLive = Awa.worker({
    queues: { email: { maxConcurrency: 20 }, billing: { maxConcurrency: 5 } },
    handlers,
    maintenance: { promoteInterval: "250 millis", rescueInterval: "10 seconds" }
  })
  yield* Effect.gen(function* () {
    const version = yield* Awa.migrate().pipe(Effect.map((r) => r.to))
    yield* Console.log(`awa schema "awa" at version ${version}; worker running, press Ctrl-C to stop`)
    yield* Effect.forkScoped(produce.pipe(Effect.repeat(Schedule.spaced("500 millis"))))
    yield* report.pipe(Effect.repeat(Schedule.spaced("1 second")))
  }).pipe(Effect.provide(WorkerLive.pipe(Layer.provideMerge(AwaLive))))
}).pipe(Effect.scoped)

NodeRuntime.runMain(program)
