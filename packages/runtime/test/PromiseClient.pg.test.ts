import { Job } from "@awa/core"
import { TestDatabase } from "@awa/testing"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Schema } from "effect"
import { createClient, type StandardSchemaLike } from "../src/PromiseClient.ts"

/** A minimal Standard Schema, as zod or valibot would provide. */
const positive: { "~standard": { validate: (v: unknown) => { issues?: Array<{ message: string }> } } } = {
  "~standard": {
    validate: (v) =>
      typeof v === "object" &&
      v !== null &&
      typeof (v as { n?: unknown }).n === "number" &&
      (v as { n: number }).n > 0
        ? {}
        : { issues: [{ message: "n must be a positive number" }] }
  }
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))
const until = async (check: () => Promise<boolean>, ms = 15_000) => {
  for (const start = Date.now(); Date.now() - start < ms; await sleep(25)) if (await check()) return
  throw new Error("condition did not hold")
}

describe("Promise facade", () => {
  it.live("defines, inserts, runs async handlers with an AbortSignal, and stops", () =>
    Effect.flatMap(TestDatabase.acquire({ migrated: false }), ({ url }) =>
      Effect.promise(async () => {
        const awa = await createClient({ databaseUrl: url, migrateOnStart: true })
        try {
          const Add = awa.define({
            kind: "add",
            args: Schema.Struct({ a: Schema.Number, b: Schema.Number }),
            queue: "p"
          })
          const Checked = awa.define({
            kind: "checked",
            args: positive as StandardSchemaLike<{ n: number }>,
            queue: "p"
          })
          const Hang = awa.define({ kind: "hang", args: Schema.Struct({}), queue: "p" })
          const sums: Array<number> = []
          let aborted = false
          const worker = await awa.start({
            queues: { p: { pollInterval: "50 millis" } },
            handlers: [
              awa.handler(Add, async ({ a, b }) => {
                sums.push(a + b)
              }),
              awa.handler(Checked, async (args) => {
                if (args.n > 100) throw new Job.JobTerminalError({ message: "too big" })
                throw new Error("try again later")
              }),
              awa.handler(
                Hang,
                (_args, { signal }) =>
                  new Promise((_resolve, reject) =>
                    signal.addEventListener("abort", () => {
                      aborted = true
                      reject(new Error("aborted"))
                    })
                  )
              )
            ],
            maintenance: false
          })
          const added = await awa.insert(Add, { a: 2, b: 3 })
          await until(async () => (await awa.getJob(added.id)).state === "completed")
          assert.deepStrictEqual(sums, [5])

          // Standard Schema: invalid args are a ValidationError at insert, nothing written
          const invalid = await awa.insert(Checked, { n: -1 }).then(
            () => undefined,
            (e: unknown) => e
          )
          assert.strictEqual((invalid as { _tag?: string })._tag, "ValidationError")
          const big = await awa.insert(Checked, { n: 1000 }, { maxAttempts: 3 })
          await until(async () => (await awa.getJob(big.id)).state === "failed")
          assert.strictEqual((await awa.getJob(big.id)).errors.at(-1)!.error, "too big")
          const small = await awa.insert(Checked, { n: 1 })
          await until(async () => (await awa.getJob(small.id)).state === "retryable")
          assert.strictEqual((await awa.getJob(small.id)).errors.at(-1)!.error, "try again later")

          const hung = await awa.insert(Hang, {})
          await until(async () => (await awa.getJob(hung.id)).state === "running")
          await awa.cancel(hung.id, "stop it")
          // no LISTEN-free shortcut here: the worker learns of the cancel by notification
          await until(async () => aborted)
          assert.strictEqual((await awa.getJob(hung.id)).state, "cancelled")
          await worker.stop()
        } finally {
          await awa.close()
        }
      })
    )
  )
})
