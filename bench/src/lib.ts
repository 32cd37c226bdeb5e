/**
 * Helpers shared by the benchmarks (`storage.ts`, `compare.ts`): the Postgres server, one-shot
 * admin clients, fresh databases, and number/table formatting.
 */
import { randomBytes } from "node:crypto"
import os from "node:os"
import * as EmbeddedPostgres from "@awa/testing/EmbeddedPostgres"
import { PgClient } from "@effect/sql-pg"
import { Effect, Redacted } from "effect"
import { Reactivity } from "effect/reactivity"

// ---------------------------------------------------------------------------------------------
// Numbers

export const now = () => performance.now()
/** The machine's 1, 5 and 15-minute load averages, for the record printed with each probe. */
export const loadLine = () =>
  os
    .loadavg()
    .map((l) => l.toFixed(2))
    .join(" ")
export const perJob = (value: number, jobs: number) => (jobs === 0 ? 0 : value / jobs)
export const round = (value: number, digits = 2) => Number(value.toFixed(digits))
export const sum = (values: ReadonlyArray<number>) => values.reduce((a, b) => a + b, 0)

/** Call or latency timings: count, mean and a few quantiles (nearest rank), in ms. */
export interface Calls {
  readonly count: number
  readonly meanMs: number
  readonly p50Ms: number
  readonly p95Ms: number
  readonly maxMs: number
}

/** Nearest-rank quantile of an ascending array. */
export const quantile = (sorted: ReadonlyArray<number>, q: number): number =>
  sorted.length === 0
    ? 0
    : sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil(q * sorted.length) - 1))]!

export const summarize = (samples: ReadonlyArray<number>): Calls => {
  const sorted = [...samples].sort((a, b) => a - b)
  return {
    count: sorted.length,
    meanMs: round(sum(sorted) / Math.max(1, sorted.length), 3),
    p50Ms: round(quantile(sorted, 0.5), 3),
    p95Ms: round(quantile(sorted, 0.95), 3),
    maxMs: round(sorted.at(-1) ?? 0, 3)
  }
}

// ---------------------------------------------------------------------------------------------
// Tables

const pad = (cells: ReadonlyArray<string | number>, widths: ReadonlyArray<number>) =>
  cells.map((c, i) => (i === 0 ? String(c).padEnd(widths[i]!) : String(c).padStart(widths[i]!))).join("  ")

/** A plain-text table: first column left-aligned, the others right-aligned. */
export const table = (
  header: ReadonlyArray<string>,
  rows: ReadonlyArray<ReadonlyArray<string | number>>
): string => {
  const widths = header.map((h, i) => Math.max(h.length, ...rows.map((r) => String(r[i]).length)))
  return [
    pad(header, widths),
    widths.map((w) => "-".repeat(w)).join("  "),
    ...rows.map((r) => pad(r, widths))
  ].join("\n")
}

// ---------------------------------------------------------------------------------------------
// Server and databases

/**
 * `url` (e.g. `--server`) or else `DATABASE_URL` when set, otherwise a temporary embedded
 * PostgreSQL with durability ON (fsync, synchronous_commit and full_page_writes at their
 * defaults), stopped and deleted when the scope closes.
 */
export const acquireServerAt = (url: string | undefined) =>
  Effect.acquireRelease(
    Effect.promise(() =>
      EmbeddedPostgres.resolve(url === undefined ? process.env : { DATABASE_URL: url }, () =>
        EmbeddedPostgres.startTemporary({ durable: true })
      )
    ),
    (server) => Effect.promise(() => server.stop())
  )

export const acquireServer = acquireServerAt(undefined)

/** Runs `f` on a one-connection client to `url`, closed afterwards. */
export const withClient = <A, E>(url: string, f: (sql: PgClient.PgClient) => Effect.Effect<A, E>) =>
  PgClient.makeClient({ url: Redacted.make(url), applicationName: "awa-bench-admin" }).pipe(
    Effect.flatMap(f),
    Effect.scoped,
    Effect.provide(Reactivity.layer)
  )

/** Runs one statement (no parameters, no result) on a fresh connection to `url`. */
export const execute = (url: string, statement: string) =>
  withClient(url, (sql) => sql.unsafe(statement).unprepared).pipe(Effect.asVoid)

/** A random database name with `prefix`. */
export const databaseName = (prefix: string) => `${prefix}_${randomBytes(4).toString("hex")}`

/** Creates database `name` on the server at `serverUrl` (optionally from a template); returns its URL. */
export const createDatabase = (serverUrl: string, name: string, template?: string) =>
  execute(serverUrl, `CREATE DATABASE ${name}${template === undefined ? "" : ` TEMPLATE ${template}`}`).pipe(
    Effect.as(EmbeddedPostgres.withDatabase(serverUrl, name))
  )

export const dropDatabase = (serverUrl: string, name: string) =>
  execute(serverUrl, `DROP DATABASE IF EXISTS ${name} WITH (FORCE)`).pipe(Effect.ignore)
