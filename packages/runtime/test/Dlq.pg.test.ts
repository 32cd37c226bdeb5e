import { Job } from "@awa/core"
import { TestDatabase } from "@awa/testing"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Layer, Schema } from "effect"
import * as Awa from "../src/Awa.ts"
import { AwaClient } from "../src/AwaClient.ts"
import { handler } from "../src/Handler.ts"
import { createClient } from "../src/PromiseClient.ts"
import { eventually } from "./support.ts"

const Charge = Job.define({
  kind: "charge",
  args: Schema.Struct({ cents: Schema.Number }),
  queue: "payments"
})
const AwaLive = Awa.layerPg().pipe(Layer.provideMerge(TestDatabase.layer()))

describe("dead letter queue with a worker", () => {
  it.live(
    "terminal failures and undecodable args land in the DLQ; a retry from it runs again and succeeds",
    () =>
      Effect.gen(function* () {
        const client = yield* AwaClient
        let gatewayUp = false
        const worker = Awa.worker({
          queues: { payments: { dlq: true, pollInterval: "50 millis" } },
          handlers: [
            handler(Charge, () =>
              gatewayUp ? Effect.void : Effect.fail(new Job.JobTerminalError({ message: "card declined" }))
            )
          ],
          maintenance: { promoteInterval: "20 millis", electionInterval: "50 millis" }
        })
        yield* Effect.gen(function* () {
          const declined = yield* client.insert(Charge, { cents: 100 })
          const [garbled] = yield* client.storage.enqueueMany([
            { kind: "charge", queue: "payments", args: { cents: "lots" } }
          ])
          yield* eventually(
            Effect.map(client.storage.listDlq({ queue: "payments" }), (entries) => entries.length === 2),
            10_000,
            "both dead-lettered"
          )
          const entry = yield* client.storage.getDlq(declined.id)
          assert.deepStrictEqual(
            [entry.reason, entry.errors.at(-1)!.error],
            ["terminal_error", "card declined"]
          )
          const bad = yield* client.storage.getDlq(garbled!.id)
          assert.strictEqual(bad.reason, "terminal_error")
          assert.match(bad.errors.at(-1)!.error, /^args failed to decode/)
          gatewayUp = true
          yield* client.storage.retryFromDlq(declined.id)
          yield* eventually(
            Effect.map(client.storage.getJob(declined.id), (j) => j.state === "completed"),
            10_000,
            "retried job completed"
          )
          const done = yield* client.storage.getJob(declined.id)
          assert.deepStrictEqual([done.attempt, done.dlqReason, done.runLease], [1, null, 2n])
        }).pipe(Effect.provide(worker), Effect.scoped)
      }).pipe(Effect.provide(AwaLive))
  )

  it.live("pausing a queue stops claims within a poll interval and resuming restarts them", () =>
    Effect.gen(function* () {
      const client = yield* AwaClient
      const ran: Array<number> = []
      yield* Effect.gen(function* () {
        yield* client.storage.pauseQueue("payments")
        const job = yield* client.insert(Charge, { cents: 1 })
        yield* Effect.sleep("300 millis")
        assert.deepStrictEqual(ran, [])
        assert.strictEqual((yield* client.storage.getJob(job.id)).state, "available")
        yield* client.storage.resumeQueue("payments")
        yield* eventually(
          Effect.sync(() => ran.length === 1),
          5_000,
          "runs after resume"
        )
      }).pipe(
        Effect.provide(
          Awa.worker({
            queues: { payments: { pollInterval: "50 millis" } },
            handlers: [handler(Charge, ({ cents }) => Effect.sync(() => void ran.push(cents)))],
            maintenance: false
          })
        ),
        Effect.scoped
      )
    }).pipe(Effect.provide(AwaLive))
  )

  it.live("the Promise facade lists, retries in bulk and purges DLQ entries", () =>
    Effect.flatMap(TestDatabase.acquire(), ({ url }) =>
      Effect.promise(async () => {
        const awa = await createClient({ databaseUrl: url })
        try {
          const Flaky = awa.define({
            kind: "flaky_export",
            args: Schema.Struct({ n: Schema.Number }),
            queue: "exports"
          })
          const worker = await awa.start({
            queues: { exports: { dlq: true, pollInterval: "50 millis" } },
            handlers: [
              awa.handler(Flaky, async () => {
                throw new Job.JobTerminalError({ message: "export target offline" })
              })
            ],
            maintenance: false
          })
          await awa.insertMany(Flaky, [{ n: 1 }, { n: 2 }, { n: 3 }])
          for (let i = 0; i < 200 && (await awa.listDlq({ queue: "exports" })).length < 3; i++)
            await new Promise((r) => setTimeout(r, 25))
          await worker.stop()
          assert.strictEqual((await awa.listDlq({ queue: "exports" })).length, 3)
          const unsafe = await awa.purgeDlqBulk({}).then(
            () => undefined,
            (e: unknown) => e
          )
          assert.strictEqual((unsafe as { _tag?: string })._tag, "UnsafeBulkFilter")
          assert.strictEqual(await awa.retryDlqBulk({ queue: "exports", kind: "flaky_export" }), 3)
          assert.strictEqual((await awa.listDlq({ queue: "exports" })).length, 0)
          assert.strictEqual(await awa.drainQueue("exports"), 3)
        } finally {
          await awa.close()
        }
      })
    )
  )
})
