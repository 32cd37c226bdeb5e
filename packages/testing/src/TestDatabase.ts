/**
 * One fresh database per test file, cloned from a migrated template (`CREATE DATABASE … TEMPLATE`),
 * so test files run in parallel without seeing each other. The vitest global setup
 * (`test/support/globalSetup.ts`) starts the server and builds the template; this module is what a
 * test file uses.
 *
 * **Guarantee** The database is dropped (`WITH (FORCE)`) when the layer's scope closes.
 */
import { randomBytes } from "node:crypto"
import { PgClient } from "@effect/sql-pg"
import { Effect, Layer, Redacted, Schedule } from "effect"
import { Reactivity } from "effect/reactivity"
import type { SqlClient, SqlError } from "effect/sql"
import { inject } from "vitest"
import { withDatabase } from "./EmbeddedPostgres.ts"

declare module "vitest" {
  export interface ProvidedContext {
    /** Superuser URL of the test server (its `postgres` database). */
    awaAdminUrl: string
    /** Name of the migrated template database. */
    awaTemplateDb: string
  }
}

/** Runs `f` on a one-connection client to the server's `postgres` database. */
export const withAdmin = <A, E>(
  adminUrl: string,
  f: (sql: PgClient.PgClient) => Effect.Effect<A, E>
): Effect.Effect<A, E | SqlError.SqlError> =>
  PgClient.make({ url: Redacted.make(adminUrl), maxConnections: 1 }).pipe(
    Effect.flatMap(f),
    Effect.scoped,
    Effect.provide(Reactivity.layer)
  )

const quote = (name: string) => `"${name.replaceAll('"', '""')}"`

// CREATE DATABASE … TEMPLATE fails with "source database is being accessed by other users" if a
// connection to the template is still closing; that is transient.
const transient = Schedule.spaced("100 millis").pipe(Schedule.upTo({ times: 20 }))

export interface TestDatabaseOptions {
  /** Clone the migrated template (default) or start from an empty database (`template0`). */
  readonly migrated?: boolean | undefined
  readonly maxConnections?: number | undefined
}

/** Creates a database, returning its URL; it is dropped when the enclosing scope closes. */
export const acquire = Effect.fnUntraced(function* (options: TestDatabaseOptions = {}) {
  const adminUrl = inject("awaAdminUrl")
  const template = options.migrated === false ? "template0" : inject("awaTemplateDb")
  const name = `awa_t_${randomBytes(6).toString("hex")}`
  yield* Effect.acquireRelease(
    withAdmin(
      adminUrl,
      (sql) => sql.unsafe(`CREATE DATABASE ${quote(name)} TEMPLATE ${quote(template)}`).unprepared
    ).pipe(Effect.retry(transient)),
    () =>
      withAdmin(
        adminUrl,
        (sql) => sql.unsafe(`DROP DATABASE IF EXISTS ${quote(name)} WITH (FORCE)`).unprepared
      ).pipe(Effect.ignore)
  )
  return { name, url: withDatabase(adminUrl, name) }
})

/** A `PgClient` (and `SqlClient`) on a fresh database cloned from the migrated template. */
export const layer = (
  options: TestDatabaseOptions = {}
): Layer.Layer<PgClient.PgClient | SqlClient.SqlClient, SqlError.SqlError> =>
  Layer.unwrap(
    Effect.map(acquire(options), ({ url }) =>
      PgClient.layer({ url: Redacted.make(url), maxConnections: options.maxConnections ?? 8 })
    )
  )
