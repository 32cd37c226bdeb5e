/**
 * Quick start (Effect): declare a job, enqueue it inside your own transaction, run a worker.
 * Used by docs/guide.md and run by test/docs-examples.test.ts.
 */
import { Awa, AwaClient, Handler, Job } from "@awa/effect"
import { Effect, Layer, Schedule, Schema } from "effect"
import { SqlClient } from "effect/sql"

// 1. A job: a kind and a Schema for its args. The same definition types producer and handler.
export const SendWelcomeEmail = Job.define({
  kind: "send_welcome_email",
  args: Schema.Struct({ userId: Schema.Number, email: Schema.String }),
  queue: "email",
  defaults: { maxAttempts: 5 }
})

// 2. A handler: an Effect. Returning nothing completes the job; errors are retried with backoff.
export const sent: Array<string> = []
export const sendWelcomeEmail = Handler.handler(SendWelcomeEmail, ({ email }, ctx) =>
  Effect.gen(function* () {
    if (email.endsWith("@invalid"))
      return yield* new Job.JobTerminalError({ message: "undeliverable address" })
    yield* Effect.logInfo(`sending to ${email} (attempt ${ctx.job.attempt})`)
    sent.push(email)
  })
)

// 3. Enqueue inside the application's transaction: the job exists only if the user does.
export const signUp = (email: string) =>
  Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    const awa = yield* AwaClient.AwaClient
    return yield* sql.withTransaction(
      Effect.gen(function* () {
        const [user] = yield* sql<{ id: number }>`INSERT INTO users (email) VALUES (${email}) RETURNING id`
        return yield* awa.insert(SendWelcomeEmail, { userId: user!.id, email })
      })
    )
  })

// 4. The layers: Awa on the application's PgClient, and a worker for the "email" queue.
export const AwaLive = Awa.layerPg({ migrateOnStart: true })
export const WorkerLive = Awa.worker({
  queues: { email: { maxConcurrency: 10 } },
  handlers: [sendWelcomeEmail]
})

/** The whole flow: sign up two users, let the worker send both mails. Needs a PgClient layer. */
export const program = Effect.gen(function* () {
  const sql = yield* SqlClient.SqlClient
  yield* sql`CREATE TABLE IF NOT EXISTS users (id serial PRIMARY KEY, email text NOT NULL)`
  const a = yield* signUp("ada@example.com")
  const b = yield* signUp("grace@example.com")
  const awa = yield* AwaClient.AwaClient
  // wait until both are done (a real application would just keep running)
  yield* Effect.gen(function* () {
    const states = yield* Effect.forEach([a.id, b.id], (id) =>
      Effect.map(awa.storage.getJob(id), (j) => j.state)
    )
    if (states.some((s) => s !== "completed")) return yield* Effect.fail("pending" as const)
  }).pipe(Effect.retry(Schedule.spaced("25 millis")), Effect.timeout("20 seconds"))
  return [a.id, b.id] as const
}).pipe(Effect.provide(WorkerLive.pipe(Layer.provideMerge(AwaLive))))
