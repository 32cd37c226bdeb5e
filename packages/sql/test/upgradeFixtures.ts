/**
 * Upgrade tests: an install built migration by migration up to a version, so a test can leave rows
 * written by the old functions in place before it applies the next migration.
 */
import { Effect } from "effect"
import { SqlClient } from "effect/sql"
import { loadMigrations, renderMigration } from "../src/Migrations.ts"

/** Applies the migrations whose version passes `versions`, in order, each recorded as `migrate` does. */
export const apply = (versions: (version: number) => boolean) =>
  Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    for (const migration of loadMigrations().filter((m) => versions(m.version)))
      yield* sql.withTransaction(
        Effect.andThen(
          Effect.forEach(renderMigration(migration, "awa"), (statement) => sql.unsafe(statement).unprepared, {
            discard: true
          }),
          sql`INSERT INTO awa.schema_version (version, name, breaking)
              VALUES (${migration.version}, ${migration.name}, ${migration.breaking})`
        )
      )
  })

/** An empty database with the schema and its version table, as `migrate` starts. */
export const emptySchema = Effect.flatMap(SqlClient.SqlClient, (sql) =>
  Effect.andThen(
    sql.unsafe("CREATE SCHEMA awa").unprepared,
    sql.unsafe(`CREATE TABLE awa.schema_version (
      version int PRIMARY KEY, name text NOT NULL, breaking boolean NOT NULL DEFAULT false,
      applied_at timestamptz NOT NULL DEFAULT now())`).unprepared
  )
)
