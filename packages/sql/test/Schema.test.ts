import { TestDatabase } from "@awa/testing"
import { describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { expect } from "vitest"
import { renderSchema } from "./schemaSnapshot.ts"

const header = `-- The Awa schema as the migrations leave it: every table, index, view and function in its
-- current definition, read from the catalogs of a freshly migrated database (schema "awa").
-- Generated: do not edit. After adding a migration, regenerate it with
--   npx vitest run packages/sql/test/Schema.test.ts -u
-- and review the diff with the migration.`

describe("schema.sql", () => {
  it.live(
    "is what the migrations produce (regenerate with `npx vitest run packages/sql/test/Schema.test.ts -u`)",
    () =>
      Effect.gen(function* () {
        const text = yield* renderSchema("awa")
        yield* Effect.promise(() => expect(`${header}\n\n${text}\n`).toMatchFileSnapshot("../schema.sql"))
      }).pipe(Effect.provide(TestDatabase.layer()))
  )
})
