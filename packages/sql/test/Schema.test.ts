import { TestDatabase } from "@awa/testing"
import { Effect } from "effect"
import { SqlClient } from "effect/sql"
import { describe, expect, it } from "vitest"
import { renderSchema } from "./schemaSnapshot.ts"

const header = `-- The Awa schema as the migrations leave it: every table, index, view and function in its
-- current definition, read from the catalogs of a freshly migrated database (schema "awa").
-- Generated on PostgreSQL 17 (the default test server): do not edit. After adding a migration,
-- regenerate it with
--   npx vitest run packages/sql/test/Schema.test.ts -u
-- and review the diff with the migration.`

/**
 * The major the file is rendered on. Other majors deparse the same catalogs differently (15
 * qualifies a view's columns with their table's alias, for one), so on another server (AWA_PG_BIN)
 * the comparison is skipped rather than failed: the migrations themselves run on every server the
 * version matrix covers.
 */
const renderedOn = 17

/** The test server's major and, on the major the file is rendered on, the schema as rendered. */
const render = Effect.gen(function* () {
  const sql = yield* SqlClient.SqlClient
  const [server] = yield* sql<{
    major: number
  }>`SELECT current_setting('server_version_num')::int / 10000 AS major`
  return { major: server!.major, text: server!.major === renderedOn ? yield* renderSchema("awa") : undefined }
}).pipe(Effect.provide(TestDatabase.layer()))

describe("schema.sql", () => {
  // a plain vitest test: skipping from inside an Effect test would log the skip as a failure
  it("is what the migrations produce (regenerate with `npx vitest run packages/sql/test/Schema.test.ts -u`)", async (ctx) => {
    const { major, text } = await Effect.runPromise(render)
    if (text === undefined)
      return ctx.skip(`schema.sql is rendered on PostgreSQL ${renderedOn}; this server is ${major}`)
    await expect(`${header}\n\n${text}\n`).toMatchFileSnapshot("../schema.sql")
  })
})
