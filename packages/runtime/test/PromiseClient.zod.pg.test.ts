/**
 * The Promise facade with zod (a Standard Schema): the validator's issues reach the caller with
 * their messages and paths, the handler receives the validator's output, and an async validator
 * is a typed error (at `define` when a probe finds it, else at insert), never an untyped `Error`.
 */
import { AwaConfigError, ValidationError } from "@awa/core"
import { TestDatabase } from "@awa/testing"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { z } from "zod"
import { createClient } from "../src/PromiseClient.ts"

const Email = z.object({
  to: z.string().email(),
  subject: z.string().min(1),
  sendAt: z.coerce.date()
})

const rejection = <A>(promise: Promise<A>) =>
  promise.then(
    () => undefined,
    (e: unknown) => e
  )

describe("Promise facade with zod", () => {
  it.live("keeps zod's issues, hands the handler zod's output, and types async validators", () =>
    Effect.flatMap(TestDatabase.acquire(), ({ url }) =>
      Effect.promise(async () => {
        const awa = await createClient({ databaseUrl: url })
        try {
          const SendEmail = awa.define({ kind: "zod_email", args: Email, queue: "zod" })

          // issues: zod's own messages, each at its path; nothing written
          const invalid = await rejection(
            awa.insert(SendEmail, { to: "nope", subject: "", sendAt: new Date("2030-01-01T00:00:00Z") })
          )
          assert.instanceOf(invalid, ValidationError)
          const reason = (invalid as ValidationError).reason
          assert.include(reason, 'Invalid email address\n  at ["to"]')
          assert.include(reason, 'Too small: expected string to have >=1 characters\n  at ["subject"]')
          assert.deepStrictEqual(await awa.listJobs({ queue: "zod" }), [])

          // output: z.coerce.date() reaches the handler as a Date
          let received: unknown
          const worker = await awa.start({
            queues: { zod: { pollInterval: "50 millis" } },
            handlers: [
              awa.handler(SendEmail, async (args) => {
                received = args.sendAt
              })
            ],
            maintenance: false
          })
          const job = await awa.insert(SendEmail, {
            to: "ada@example.com",
            subject: "hi",
            sendAt: new Date("2030-01-02T03:04:05.000Z")
          })
          for (let i = 0; i < 600 && (await awa.getJob(job.id)).state !== "completed"; i++)
            await new Promise((resolve) => setTimeout(resolve, 25))
          assert.instanceOf(received, Date)
          assert.strictEqual((received as Date).toISOString(), "2030-01-02T03:04:05.000Z")
          await worker.stop()

          // async: found by define's probe (a string reaches the refinement)
          let thrown: unknown
          try {
            awa.define({ kind: "zod_async", args: z.string().refine(async (s) => s.length > 0) })
          } catch (e) {
            thrown = e
          }
          assert.instanceOf(thrown, AwaConfigError)
          assert.include(
            (thrown as AwaConfigError).message,
            "async Standard Schema validators are not supported"
          )

          // async behind a shape no probe satisfies: a typed ValidationError at insert, nothing written
          const Hidden = awa.define({
            kind: "zod_async_hidden",
            args: z.object({ id: z.string() }).refine(async (o) => o.id !== ""),
            queue: "zod-hidden"
          })
          const late = await rejection(awa.insert(Hidden, { id: "x" }))
          assert.instanceOf(late, ValidationError)
          assert.include(
            (late as ValidationError).reason,
            "async Standard Schema validators are not supported"
          )
          assert.deepStrictEqual(await awa.listJobs({ queue: "zod-hidden" }), [])
        } finally {
          await awa.close()
        }
      })
    )
  )
})
