/**
 * Versioned, forward-only migrations and the schema-version fence (capability 1, ADR-041).
 *
 * **Guarantee** One `migrate` call applies every pending migration in one transaction, under a
 * transaction-scoped advisory lock keyed by the schema name: two processes migrating at once both
 * succeed, one applies and the other, once the lock is free, finds nothing to do. A schema newer
 * than this code fails with `SchemaTooNew` before anything is written.
 *
 * **Details** Migration files live in `packages/sql/migrations/NNNN_name.sql` as reviewed text;
 * they ship as code, in `migrations.generated.ts` (`npm run gen:migrations` writes it, a test
 * checks it matches), so nothing here reads the file system and bundles carry the migrations.
 * `:AWA_SCHEMA` stands for the (validated, unquoted) schema name; a first-line marker
 * `--! breaking` flags migrations older code cannot run against (read by the N-1 fence later).
 * Ring sizes are fixed at install by the migration text, so no DDL ever runs at run time.
 */
import { AwaConfigError, SchemaNotMigrated, SchemaTooNew } from "@awa/core"
import { Effect, Schedule } from "effect"
import { SqlClient, type SqlError } from "effect/sql"
import { migrationFiles } from "./migrations.generated.ts"
import { isValidSchemaName, splitStatements } from "./SqlText.ts"

export interface Migration {
  readonly version: number
  readonly name: string
  readonly breaking: boolean
  readonly text: string
}

export interface MigrateResult {
  readonly schema: string
  readonly from: number
  readonly to: number
  readonly applied: ReadonlyArray<number>
}

export interface SchemaOptions {
  /** Postgres schema holding Awa's tables. Default `"awa"`; lower-case identifier, 1–50 bytes. */
  readonly schema?: string | undefined
}

export const defaultSchema = "awa"

// The generator only writes files named like this (and rejects duplicate versions).
const fileName = /^(\d{4})_([a-z0-9_]+)\.sql$/

const migrations: ReadonlyArray<Migration> = migrationFiles
  .flatMap(({ file, text }) => {
    const match = fileName.exec(file)
    if (match === null) return []
    return [{ version: Number(match[1]), name: match[2]!, breaking: text.startsWith("--! breaking"), text }]
  })
  .sort((a, b) => a.version - b.version)

/** The migrations shipped with this package (compiled in, no I/O), in version order. */
export const loadMigrations = (): ReadonlyArray<Migration> => migrations

/** The newest schema version this code knows. */
export const latestVersion = (): number => loadMigrations().at(-1)?.version ?? 0

/** The statements of one migration with the schema placeholder filled in. */
export const renderMigration = (migration: Migration, schema: string): Array<string> =>
  splitStatements(migration.text.replaceAll(":AWA_SCHEMA", schema))

/** Checks a schema name, failing with the typed configuration error. */
export const checkSchemaName = (schema: string): Effect.Effect<string, AwaConfigError> =>
  isValidSchemaName(schema)
    ? Effect.succeed(schema)
    : Effect.fail(
        new AwaConfigError({
          issues: [{ path: "schema", reason: `"${schema}" must match [a-z_][a-z0-9_]{0,49}` }]
        })
      )

// Persistent advisory-lock wire format: every Awa version must derive this key the same way.
const migrationLockKey = (schema: string) => `awa:migrate:${schema}`

const readVersionInTx = Effect.fnUntraced(function* (sql: SqlClient.SqlClient, schema: string) {
  const rows = yield* sql<{
    v: number
  }>`SELECT coalesce(max(version), 0)::int AS v FROM ${sql(schema)}.schema_version`
  return rows[0]?.v ?? 0
})

/**
 * Reads the applied schema version without writing anything: 0 when Awa was never installed.
 */
export const currentVersion = Effect.fn("Migrations.currentVersion")(function* (options: SchemaOptions = {}) {
  const schema = yield* checkSchemaName(options.schema ?? defaultSchema)
  return Math.max(0, ...(yield* appliedVersions(schema)))
})

// Concurrent DDL can still deadlock against other sessions touching the same catalogs; retried
// as the spec says: up to 5 times with 50 ms × 2^n backoff.
/**
 * The migrations `migrate` would apply now, in version order (known versions not yet recorded),
 * without writing anything: what `awa migrate --dry-run` lists.
 */
export const pending = Effect.fn("Migrations.pending")(function* (options: SchemaOptions = {}) {
  const schema = yield* checkSchemaName(options.schema ?? defaultSchema)
  const applied = yield* appliedVersions(schema)
  return loadMigrations().filter((m) => !applied.has(m.version))
})

const deadlockRetry = Schedule.exponential("50 millis").pipe(
  Schedule.setInputType<SqlError.SqlError | SchemaTooNew>(),
  Schedule.while(({ input }) => input._tag === "SqlError" && input.reason._tag === "DeadlockError"),
  Schedule.upTo({ times: 5 })
)

/** Applies every pending migration in one transaction. */
export const migrate = Effect.fn("Migrations.migrate")(function* (options: SchemaOptions = {}) {
  const schema = yield* checkSchemaName(options.schema ?? defaultSchema)
  const sql = yield* SqlClient.SqlClient
  const migrations = loadMigrations()
  const known = migrations.at(-1)?.version ?? 0
  const run = sql.withTransaction(
    Effect.gen(function* () {
      yield* sql`SELECT pg_advisory_xact_lock(hashtextextended(${migrationLockKey(schema)}, 0))`
      // Statements after the lock see every migration committed by whoever held it before us.
      yield* sql.unsafe(`CREATE SCHEMA IF NOT EXISTS ${schema}`).unprepared
      yield* sql.unsafe(`CREATE TABLE IF NOT EXISTS ${schema}.schema_version (
        version    int PRIMARY KEY,
        name       text NOT NULL,
        breaking   boolean NOT NULL DEFAULT false,
        applied_at timestamptz NOT NULL DEFAULT now()
      )`).unprepared
      const from = yield* readVersionInTx(sql, schema)
      if (from > known) return yield* new SchemaTooNew({ schema, found: from, known })
      // Every known migration not yet recorded, in order: a migration numbered below one that was
      // already applied (two branches merged) still runs.
      const applied = new Set(
        (yield* sql<{ version: number }>`SELECT version FROM ${sql(schema)}.schema_version`).map(
          (r) => r.version
        )
      )
      const pending = migrations.filter((m) => !applied.has(m.version))
      for (const migration of pending) {
        for (const statement of renderMigration(migration, schema)) yield* sql.unsafe(statement).unprepared
        yield* sql`INSERT INTO ${sql(schema)}.schema_version (version, name, breaking)
                   VALUES (${migration.version}, ${migration.name}, ${migration.breaking})`
      }
      return {
        schema,
        from,
        to: Math.max(from, known),
        applied: pending.map((m) => m.version)
      } satisfies MigrateResult
    })
  )
  return yield* Effect.retry(run, deadlockRetry)
})

export interface FenceOptions extends SchemaOptions {
  /** Apply pending migrations instead of failing with `SchemaNotMigrated`. Default false. */
  readonly migrateOnStart?: boolean | undefined
}

/**
 * The start-up fence: reads the schema version before any write. Newer than this code ⇒
 * `SchemaTooNew` (fail closed); older ⇒ `SchemaNotMigrated` unless `migrateOnStart`.
 */
export const ensureCompatible = Effect.fn("Migrations.ensureCompatible")(function* (
  options: FenceOptions = {}
) {
  const schema = yield* checkSchemaName(options.schema ?? defaultSchema)
  const known = loadMigrations()
  const latest = known.at(-1)?.version ?? 0
  const applied = yield* appliedVersions(schema)
  const found = Math.max(0, ...applied)
  if (found > latest) return yield* new SchemaTooNew({ schema, found, known: latest })
  if (known.every((m) => applied.has(m.version))) return found
  if (options.migrateOnStart) return (yield* migrate({ schema })).to
  return yield* new SchemaNotMigrated({ schema, found, required: latest })
})

/** The versions recorded in `schema_version`; empty when Awa was never installed. */
const appliedVersions = Effect.fnUntraced(function* (schema: string) {
  const sql = yield* SqlClient.SqlClient
  const [present] = yield* sql<{
    ok: boolean
  }>`SELECT to_regclass(${`${schema}.schema_version`}) IS NOT NULL AS ok`
  if (!present?.ok) return new Set<number>()
  const rows = yield* sql<{ version: number }>`SELECT version FROM ${sql(schema)}.schema_version`
  return new Set(rows.map((r) => r.version))
})
