/**
 * `awa key-policy` (issue 20, capabilities.md §23): create, show, lower (to draining), resume,
 * cancel-change and disable, with their outputs and exit codes, and bad input refused with exit 1
 * and a message naming what is wrong.
 */
import { KeyGrants, PgKeyGrants, QueueStorage } from "@awa/storage"
import { PgClient } from "@effect/sql-pg"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Layer, Redacted } from "effect"
import { awa, fresh, json, withDatabase } from "./support.ts"

describe("awa key-policy", () => {
  it.live("create, show, lower, resume, cancel-change, disable; bad input exits 1", () =>
    withDatabase((url) =>
      Effect.gen(function* () {
        const p = fresh("tenants")
        const created = yield* awa(url, "key-policy", "create", p, "--max-in-flight", "2")
        assert.deepStrictEqual(
          [created.code, created.out],
          [0, `key policy ${p}: active, maxInFlight 2, epoch 0`]
        )
        const shown = json(yield* awa(url, "--json", "key-policy", "show", p))
        assert.deepStrictEqual([shown.id, shown.maxInFlight, shown.state, shown.epoch], [p, 2, "active", "0"])

        // two open grants of key "a": lowering to 1 stays draining
        const storage = yield* QueueStorage
        const q = fresh("kq")
        yield* storage.enqueueMany([
          { kind: "k", queue: q, args: {}, concurrencyKey: "a" },
          { kind: "k", queue: q, args: {}, concurrencyKey: "a" }
        ])
        const claimed = yield* Effect.flatMap(KeyGrants, (g) =>
          g.claim({ queue: q, policy: p, max: 2, deadlineMs: 0, agingIntervalMs: 0 })
        ).pipe(
          Effect.provide(
            PgKeyGrants.layer().pipe(
              Layer.provide(PgClient.layer({ url: Redacted.make(url), maxConnections: 1 }))
            )
          )
        )
        assert.strictEqual(claimed._tag === "Claimed" ? claimed.jobs.length : 0, 2)
        const draining = yield* awa(
          url,
          "key-policy",
          "lower",
          p,
          "--target",
          "1",
          "--verify-timeout-ms",
          "0"
        )
        assert.strictEqual(draining.code, 0)
        assert.include(draining.out, `key policy ${p}: draining to 1 (epoch 1)`)
        const listed = yield* awa(url, "key-policy", "show")
        assert.strictEqual(listed.code, 0)
        assert.match(listed.out, new RegExp(`${p} +draining +2 +1 `))
        const stale = yield* awa(url, "key-policy", "resume", p, "--epoch", "0", "--target", "1")
        assert.strictEqual(stale.code, 1)
        assert.include(stale.err, "StaleKeyPolicyEpoch")
        const still = json(
          yield* awa(url, "--json", "key-policy", "resume", p, "--epoch", "1", "--target", "1")
        )
        assert.deepStrictEqual([still.state, still.epoch], ["draining", "1"])
        const cancelled = yield* awa(url, "key-policy", "cancel-change", p, "--epoch", "1", "--target", "1")
        assert.deepStrictEqual(
          [cancelled.code, cancelled.out],
          [0, `key policy ${p}: active, maxInFlight 2, epoch 2`]
        )
        const disabled = yield* awa(url, "key-policy", "disable", p)
        assert.strictEqual(disabled.code, 0)
        assert.include(disabled.out, `key policy ${p}: disabled, maxInFlight 2, epoch 3`)

        // bad input
        const badLimit = yield* awa(url, "key-policy", "create", fresh("x"), "--max-in-flight", "0")
        assert.strictEqual(badLimit.code, 1)
        assert.include(badLimit.err, "ValidationError")
        assert.include(badLimit.err, "maxInFlight")
        const badEpoch = yield* awa(url, "key-policy", "resume", p, "--epoch", "-1", "--target", "1")
        assert.deepStrictEqual([badEpoch.code, badEpoch.err], [1, "not an epoch: -1"])
        const missing = yield* awa(url, "key-policy", "show", "nobody")
        assert.strictEqual(missing.code, 1)
        assert.include(missing.err, "KeyPolicyNotFound")
        const badId = yield* awa(url, "key-policy", "disable", " padded ")
        assert.strictEqual(badId.code, 1)
        assert.include(badId.err, "ValidationError")
      })
    )
  )
})
