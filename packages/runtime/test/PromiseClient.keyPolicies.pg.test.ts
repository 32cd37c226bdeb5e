/**
 * The Promise facade's key-policy methods (issue 20, capabilities.md §23): create, show, stats,
 * lower (active and draining), resume, cancelChange, forceDisable; bad input rejects with the
 * typed error (ValidationError, KeyPolicyNotFound, StaleKeyPolicyEpoch), nothing written.
 */
import { ValidationError } from "@awa/core"
import { KeyPolicyNotFound, StaleKeyPolicyEpoch } from "@awa/storage"
import { TestDatabase } from "@awa/testing"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Schema } from "effect"
import { createClient } from "../src/PromiseClient.ts"

/** The rejection of `promise` (fails the test when it resolves). */
const rejection = async (promise: Promise<unknown>): Promise<unknown> => {
  try {
    await promise
  } catch (error) {
    return error
  }
  throw new Error("expected a rejection")
}

describe("Promise facade: key policies", () => {
  it.live("create, show, stats, lower, resume, cancelChange, forceDisable; typed rejections", () =>
    Effect.flatMap(TestDatabase.acquire(), ({ url }) =>
      Effect.promise(async () => {
        const awa = await createClient({ databaseUrl: url })
        try {
          const created = await awa.keyPolicies.create({ id: "facade-tenants", maxInFlight: 1 })
          assert.deepStrictEqual(
            [created.id, created.maxInFlight, created.state, created.epoch],
            ["facade-tenants", 1, "active", 0n]
          )
          assert.deepStrictEqual((await awa.keyPolicies.show("facade-tenants")).maxInFlight, 1)
          const raised = await awa.keyPolicies.lower("facade-tenants", 2)
          assert.deepStrictEqual(raised, { epoch: 1n, state: "active" })

          // two running jobs of one key, then a lower to 1: draining
          const Task = awa.define({
            kind: "facade-k",
            args: Schema.Struct({ n: Schema.Number }),
            queue: "facade-k"
          })
          await awa.insertMany(Task, [{ n: 1 }, { n: 2 }], { concurrencyKey: "a" })
          const release: Array<() => void> = []
          const started = new Set<number>()
          const worker = await awa.start({
            queues: { "facade-k": { keyPolicy: "facade-tenants", pollInterval: "50 millis" } },
            handlers: [
              awa.handler(
                Task,
                ({ n }) =>
                  new Promise<void>((resolve) => {
                    started.add(n)
                    release.push(resolve)
                  })
              )
            ],
            maintenance: false
          })
          try {
            for (let i = 0; i < 400 && started.size < 2; i++) await new Promise((r) => setTimeout(r, 25))
            assert.strictEqual(started.size, 2)
            const stats = await awa.keyPolicies.stats()
            assert.deepStrictEqual(
              stats.filter((s) => s.policy === "facade-tenants").map((s) => [s.openGrants, s.keysAtLimit]),
              [[2, 1]]
            )
            const draining = await awa.keyPolicies.lower("facade-tenants", 1, { verifyTimeoutMs: 0 })
            assert.deepStrictEqual(draining, { epoch: 2n, state: "draining" })
            assert.instanceOf(
              await rejection(awa.keyPolicies.resume("facade-tenants", 1n, 1)),
              StaleKeyPolicyEpoch
            )
            assert.deepStrictEqual(await awa.keyPolicies.resume("facade-tenants", 2n, 1), {
              epoch: 2n,
              state: "draining"
            })
            const back = await awa.keyPolicies.cancelChange("facade-tenants", 2n, 1)
            assert.deepStrictEqual([back.state, back.maxInFlight, back.epoch], ["active", 2, 3n])
          } finally {
            for (const r of release) r()
            await worker.stop()
          }
          const disabled = await awa.keyPolicies.forceDisable("facade-tenants")
          assert.deepStrictEqual([disabled.state, disabled.epoch], ["disabled", 4n])

          // bad input
          assert.instanceOf(
            await rejection(awa.keyPolicies.create({ id: "", maxInFlight: 1 })),
            ValidationError
          )
          assert.instanceOf(
            await rejection(awa.keyPolicies.create({ id: "x", maxInFlight: 0 })),
            ValidationError
          )
          assert.instanceOf(await rejection(awa.keyPolicies.lower("facade-tenants", 1.5)), ValidationError)
          assert.instanceOf(await rejection(awa.keyPolicies.show("nobody")), KeyPolicyNotFound)
          assert.instanceOf(await rejection(awa.keyPolicies.forceDisable("nobody")), KeyPolicyNotFound)
          assert.isFalse(
            (await awa.keyPolicies.stats()).some((s) => s.policy === "x"),
            "nothing written"
          )
        } finally {
          await awa.close()
        }
      })
    )
  )
})
