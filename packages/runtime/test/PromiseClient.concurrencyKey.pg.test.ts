/**
 * A definition's `concurrencyKey` through the Promise facade on Postgres (capabilities.md §23):
 * one `insertMany` stores each job's own key, derived from its args; a job whose function gives
 * `undefined` has none; a throwing function rejects the batch with a `ValidationError` and writes
 * nothing.
 */
import { ValidationError } from "@awa/core"
import { TestDatabase } from "@awa/testing"
import { PgClient } from "@effect/sql-pg"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Redacted, Schema } from "effect"
import { SqlClient } from "effect/sql"
import { createClient } from "../src/PromiseClient.ts"

const storedKeys = (url: string, queue: string) =>
  Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    const rows = yield* sql<{ k: string | null }>`
      SELECT metadata ->> 'awa:concurrencyKey' AS k FROM awa.jobs WHERE queue = ${queue} ORDER BY job_id`
    return rows.map((r) => r.k)
  }).pipe(Effect.provide(PgClient.layer({ url: Redacted.make(url), maxConnections: 1 })))

describe("Promise facade: a definition's concurrencyKey", () => {
  it.live("keys each job of one insertMany by its args; a throw rejects the batch", () =>
    Effect.gen(function* () {
      const { url } = yield* TestDatabase.acquire()
      const awa = yield* Effect.promise(() => createClient({ databaseUrl: url }))
      try {
        const Task = awa.define({
          kind: "tenant-task",
          args: Schema.Struct({ tenant: Schema.String }),
          queue: "tenants",
          concurrencyKey: ({ tenant }) => (tenant === "-" ? undefined : `tenant:${tenant}`)
        })
        yield* Effect.promise(() =>
          awa.insertMany(Task, [{ tenant: "a" }, { tenant: "b" }, { tenant: "-" }, { tenant: "a" }])
        )
        assert.deepStrictEqual(yield* storedKeys(url, "tenants"), ["tenant:a", "tenant:b", null, "tenant:a"])

        const Throwing = awa.define({
          kind: "tenant-task",
          args: Schema.Struct({ tenant: Schema.String }),
          queue: "tenants",
          concurrencyKey: ({ tenant }) => {
            if (tenant === "?") throw new Error("unknown tenant")
            return tenant
          }
        })
        const error = yield* Effect.promise(() =>
          awa.insertMany(Throwing, [{ tenant: "c" }, { tenant: "?" }]).then(
            () => undefined,
            (e: unknown) => e
          )
        )
        assert.instanceOf(error, ValidationError)
        assert.include((error as ValidationError).reason, "unknown tenant")
        assert.strictEqual((yield* storedKeys(url, "tenants")).length, 4, "nothing written")
      } finally {
        yield* Effect.promise(() => awa.close())
      }
    }).pipe(Effect.scoped)
  )
})
