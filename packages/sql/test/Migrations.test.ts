import { SchemaNotMigrated, SchemaTooNew } from "@awa/core"
import { TestDatabase } from "@awa/testing"
import { PgClient } from "@effect/sql-pg"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Redacted } from "effect"
import { SqlClient } from "effect/sql"
import {
  currentVersion,
  ensureCompatible,
  latestVersion,
  loadMigrations,
  migrate
} from "../src/Migrations.ts"

const catalog = Effect.gen(function* () {
  const sql = yield* SqlClient.SqlClient
  return yield* sql<{ name: string; kind: string }>`
    SELECT c.relname AS name, c.relkind::text AS kind FROM pg_class c
    JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'awa' ORDER BY 1`
})

const versionRows = (schema = "awa") =>
  Effect.flatMap(
    SqlClient.SqlClient,
    (sql) => sql<{ version: number }>`SELECT version FROM ${sql(schema)}.schema_version ORDER BY version`
  )

/** A client on a fresh, empty database (not the migrated template). */
const emptyDatabase = TestDatabase.layer({ migrated: false })

describe("Migrations", () => {
  it("knows its migrations in version order", () => {
    const versions = loadMigrations().map((m) => m.version)
    assert.deepStrictEqual(
      versions,
      [...versions].sort((a, b) => a - b)
    )
    assert.strictEqual(latestVersion(), versions.at(-1))
  })

  it.live("applies every migration once; a second run changes nothing", () =>
    Effect.gen(function* () {
      const first = yield* migrate()
      assert.strictEqual(first.from, 0)
      assert.deepStrictEqual(
        first.applied,
        loadMigrations().map((m) => m.version)
      )
      const before = yield* catalog
      const second = yield* migrate()
      assert.deepStrictEqual(second.applied, [])
      assert.strictEqual(second.from, latestVersion())
      assert.deepStrictEqual(yield* catalog, before)
      assert.strictEqual(yield* currentVersion(), latestVersion())
    }).pipe(Effect.provide(emptyDatabase))
  )

  it.live("two connections migrating at once both succeed and leave one correct schema", () =>
    Effect.gen(function* () {
      const { url } = yield* TestDatabase.acquire({ migrated: false })
      const client = PgClient.layer({ url: Redacted.make(url), maxConnections: 1 })
      const results = yield* Effect.all(
        [
          migrate().pipe(Effect.provide(client, { local: true })),
          migrate().pipe(Effect.provide(client, { local: true }))
        ],
        { concurrency: 2 }
      )
      const applied = results.map((r) => r.applied.length).sort()
      assert.deepStrictEqual(applied, [0, loadMigrations().length])
      const rows = yield* versionRows().pipe(Effect.provide(client))
      assert.deepStrictEqual(
        rows.map((r) => r.version),
        loadMigrations().map((m) => m.version)
      )
    })
  )

  it.live("refuses a schema newer than the code with SchemaTooNew, before writing anything", () =>
    Effect.gen(function* () {
      const sql = yield* SqlClient.SqlClient
      yield* migrate()
      const future = latestVersion() + 1
      yield* sql`INSERT INTO awa.schema_version (version, name) VALUES (${future}, 'from_the_future')`
      const viaMigrate = yield* Effect.flip(migrate())
      assert.instanceOf(viaMigrate, SchemaTooNew)
      const viaFence = yield* Effect.flip(ensureCompatible({ migrateOnStart: true }))
      assert.instanceOf(viaFence, SchemaTooNew)
      const err = yield* Effect.flip(ensureCompatible())
      assert.instanceOf(err, SchemaTooNew)
      if (err instanceof SchemaTooNew) {
        assert.strictEqual(err.found, future)
        assert.strictEqual(err.known, latestVersion())
        assert.match(err.message, /newer than this code knows/)
      }
      assert.strictEqual((yield* versionRows()).length, loadMigrations().length + 1)
    }).pipe(Effect.provide(emptyDatabase))
  )

  it.live("an older schema is SchemaNotMigrated unless migrateOnStart", () =>
    Effect.gen(function* () {
      const err = yield* Effect.flip(ensureCompatible())
      assert.instanceOf(err, SchemaNotMigrated)
      assert.strictEqual(yield* currentVersion(), 0)
      assert.strictEqual(yield* ensureCompatible({ migrateOnStart: true }), latestVersion())
      assert.strictEqual(yield* ensureCompatible(), latestVersion())
    }).pipe(Effect.provide(emptyDatabase))
  )

  it.live("installs into a configurable schema and rejects invalid schema names", () =>
    Effect.gen(function* () {
      const result = yield* migrate({ schema: "tenant_a" })
      assert.strictEqual(result.to, latestVersion())
      assert.strictEqual(yield* currentVersion({ schema: "tenant_a" }), latestVersion())
      assert.strictEqual(yield* currentVersion(), 0)
      const bad = yield* Effect.flip(migrate({ schema: "Robert'); DROP TABLE x;--" }))
      assert.strictEqual(bad._tag, "AwaConfigError")
    }).pipe(Effect.provide(emptyDatabase))
  )
})
