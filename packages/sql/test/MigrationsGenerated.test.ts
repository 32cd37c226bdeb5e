/**
 * The migrations ship as code: `src/migrations.generated.ts` must be exactly what
 * `npm run gen:migrations` writes from the reviewed `migrations/*.sql` files.
 */
import { readFileSync } from "node:fs"
import { assert, describe, it } from "@effect/vitest"
import { command, generatedFile, readMigrationFiles, render } from "../../../scripts/gen-migrations.ts"
import { loadMigrations } from "../src/Migrations.ts"

describe("generated migrations module", () => {
  it(`matches migrations/*.sql (if not, run \`${command}\`)`, () => {
    const files = readMigrationFiles()
    const stale = `packages/sql/src/migrations.generated.ts is out of date with packages/sql/migrations/*.sql: run \`${command}\` and commit the result`
    assert.strictEqual(readFileSync(generatedFile, "utf8"), render(files), stale)
    // What the loader serves is the .sql text, byte for byte, and nothing else.
    assert.deepStrictEqual(
      loadMigrations().map((m) => `${String(m.version).padStart(4, "0")}_${m.name}.sql`),
      files.map((f) => f.file),
      stale
    )
    assert.deepStrictEqual(
      loadMigrations().map((m) => m.text),
      files.map((f) => f.text),
      stale
    )
  })

  it("numbers the migrations 1..N without gaps", () => {
    const versions = loadMigrations().map((m) => m.version)
    assert.deepStrictEqual(
      versions,
      versions.map((_, i) => i + 1)
    )
  })
})
