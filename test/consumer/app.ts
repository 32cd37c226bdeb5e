/**
 * The application the consumer test (`npm run test:consumer`, scripts/consumer-test.ts) installs
 * Awa into from the packed tarballs, outside the workspace: it imports only what a user imports,
 * is type-checked with a plain `tsc` configuration, runs on the oldest Node the `engines` field
 * promises, and runs again bundled by esbuild.
 *
 * It enqueues one job in a transaction that commits and one in a transaction that rolls back, runs
 * a worker until the committed job is completed, checks the rolled-back one never existed, and
 * inserts one job into the in-memory engine of `@awa/effect/simulation`. Exit code 0 means it all
 * held; `DATABASE_URL` names an empty database.
 */
import { Awa, AwaClient, Handler, Job, JobNotFound } from "@awa/effect"
import * as Simulation from "@awa/effect/simulation"
import { NodeRuntime } from "@effect/platform-node"
import { PgClient } from "@effect/sql-pg"
import { Effect, Layer, Redacted, Schedule, Schema } from "effect"
import { SqlClient } from "effect/sql"

const Invoice = Job.define({
  kind: "send_invoice",
  args: Schema.Struct({ orderId: Schema.Number, email: Schema.String }),
  queue: "billing"
})

const sent: Array<number> = []
const sendInvoice = Handler.handler(Invoice, ({ orderId }) => Effect.sync(() => void sent.push(orderId)))

class PaymentDeclined extends Schema.TaggedError<PaymentDeclined>()("PaymentDeclined", {}) {}

/** Inserts an order and its invoice job in one transaction; `decline` rolls both back. */
const placeOrder = (email: string, decline: boolean) =>
  Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    const awa = yield* AwaClient.AwaClient
    return yield* sql.withTransaction(
      Effect.gen(function* () {
        const [order] = yield* sql<{ id: number }>`INSERT INTO orders (email) VALUES (${email}) RETURNING id`
        const job = yield* awa.insert(Invoice, { orderId: order!.id, email })
        if (decline) return yield* new PaymentDeclined()
        return job
      })
    )
  })

const check = (ok: boolean, what: string) => (ok ? Effect.void : Effect.die(new Error(`failed: ${what}`)))

const onPostgres = Effect.gen(function* () {
  const sql = yield* SqlClient.SqlClient
  const awa = yield* AwaClient.AwaClient
  yield* sql`CREATE TABLE orders (id serial PRIMARY KEY, email text NOT NULL)`
  const committed = yield* placeOrder("ada@example.com", false)
  yield* Effect.flip(placeOrder("bob@example.com", true))
  // the rolled-back transaction took its job id with it: the next id was never a row
  const missing = yield* Effect.flip(awa.storage.getJob(committed.id + 1n))
  yield* check(missing instanceof JobNotFound, "the rolled-back job does not exist")
  const done = yield* awa.storage.getJob(committed.id).pipe(
    Effect.flatMap((job) => (job.state === "completed" ? Effect.succeed(job) : Effect.fail("pending"))),
    Effect.retry(Schedule.spaced("20 millis")),
    Effect.timeout("30 seconds")
  )
  const [orders] = yield* sql<{ n: number }>`SELECT count(*)::int AS n FROM orders`
  yield* check(orders?.n === 1 && sent.length === 1, "one order, one invoice sent")
  yield* Effect.logInfo(`job ${done.id} ${done.state} on Postgres; the rolled-back one never existed`)
}).pipe(
  Effect.provide(
    Awa.worker({ queues: { billing: { maxConcurrency: 2 } }, handlers: [sendInvoice] }).pipe(
      Layer.provideMerge(Awa.layerPg({ migrateOnStart: true })),
      Layer.provideMerge(PgClient.layer({ url: Redacted.make(process.env["DATABASE_URL"] ?? "") }))
    )
  )
)

const inMemory = Effect.gen(function* () {
  const awa = yield* AwaClient.AwaClient
  const job = yield* awa.insert(Invoice, { orderId: 7, email: "sim@example.com" })
  yield* check((yield* awa.storage.getJob(job.id)).state === "available", "simulated insert")
  yield* Effect.logInfo(`job ${job.id} available in the simulation`)
}).pipe(Effect.provide(Simulation.layer()))

NodeRuntime.runMain(Effect.andThen(onPostgres, inMemory))
