import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { SqlClient } from "effect/sql"
import { acquire, layer } from "../src/TestDatabase.ts"

describe("TestDatabase", () => {
  it.live("gives each acquisition its own migrated database", () =>
    Effect.gen(function* () {
      const a = yield* acquire()
      const b = yield* acquire()
      assert.notStrictEqual(a.name, b.name)
      const sql = yield* SqlClient.SqlClient
      const [row] = yield* sql<{ db: string; version: number }>`
        SELECT current_database() AS db, (SELECT max(version) FROM awa.schema_version) AS version`
      assert.match(row!.db, /^awa_t_/)
      assert.isAbove(row!.version, 0)
      // Each test file creates this same table: a shared database would make one of them fail.
      yield* sql`CREATE TABLE isolation_probe (file text PRIMARY KEY)`
      yield* sql`INSERT INTO isolation_probe VALUES ('TestDatabase.test.ts')`
      const rows = yield* sql`SELECT * FROM isolation_probe`
      assert.strictEqual(rows.length, 1)
    }).pipe(Effect.provide(layer()))
  )
})
