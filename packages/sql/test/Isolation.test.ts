import { TestDatabase } from "@awa/testing"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { SqlClient } from "effect/sql"

describe("per-file databases", () => {
  it.live("a second test file creating the same table does not collide", () =>
    Effect.gen(function* () {
      const sql = yield* SqlClient.SqlClient
      yield* sql`CREATE TABLE isolation_probe (file text PRIMARY KEY)`
      yield* sql`INSERT INTO isolation_probe VALUES ('Isolation.test.ts')`
      const rows = yield* sql<{ file: string }>`SELECT * FROM isolation_probe`
      assert.deepStrictEqual(
        rows.map((r) => r.file),
        ["Isolation.test.ts"]
      )
    }).pipe(Effect.provide(TestDatabase.layer()))
  )
})
