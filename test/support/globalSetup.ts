/**
 * Vitest global setup: one Postgres for the whole run and one migrated template database.
 *
 * Uses `DATABASE_URL` when set (the role needs CREATEDB); otherwise starts a temporary embedded
 * PostgreSQL 17 (or the install in `AWA_PG_BIN`, with `AWA_PG_SETTINGS`: see
 * `EmbeddedPostgres.optionsFromEnv`) that is stopped and deleted at teardown, or by its reaper if
 * this process dies. The template gets a unique name so two runs can share one server.
 */
import { randomBytes } from "node:crypto"
import { Migrations } from "@awa/sql"
import { PgClient } from "@effect/sql-pg"
import { Effect, Redacted } from "effect"
import type { TestProject } from "vitest/node"
import {
  optionsFromEnv,
  resolve,
  startTemporary,
  withDatabase
} from "../../packages/testing/src/EmbeddedPostgres.ts"
import { causeLine, redactUrl } from "../../packages/testing/src/errors.ts"
import { withAdmin } from "../../packages/testing/src/TestDatabase.ts"

/** Runs `effect`; a failure becomes an error whose first line names the step and the root cause. */
const step = async (what: string, effect: Effect.Effect<unknown, unknown>) => {
  try {
    await Effect.runPromise(effect)
  } catch (error) {
    throw new Error(`test setup: ${what} failed: ${causeLine(error)}`, { cause: error })
  }
}

export default async function setup(project: TestProject) {
  const server = await resolve(process.env, () => startTemporary(optionsFromEnv(process.env)))
  const adminUrl = server.url
  const template = `awa_template_${randomBytes(4).toString("hex")}`
  const dropTemplate = () =>
    Effect.runPromise(
      withAdmin(adminUrl, (sql) => sql.unsafe(`DROP DATABASE IF EXISTS ${template} WITH (FORCE)`).unprepared)
    )
  try {
    await step(
      `creating the template database on ${redactUrl(adminUrl)}`,
      withAdmin(adminUrl, (sql) => sql.unsafe(`CREATE DATABASE ${template}`).unprepared)
    )
    await step(
      `migrating the template database ${template}`,
      Migrations.migrate().pipe(
        Effect.provide(
          PgClient.layer({ url: Redacted.make(withDatabase(adminUrl, template)), maxConnections: 1 })
        )
      )
    )
  } catch (error) {
    await dropTemplate().catch(() => {})
    await server.stop()
    throw error
  }
  project.provide("awaAdminUrl", adminUrl)
  project.provide("awaTemplateDb", template)
  return async () => {
    await dropTemplate().catch(() => {})
    await server.stop()
  }
}
