/**
 * Server-side figures for the comparison: WAL position, checkpoints, ANALYZE, per-table write
 * statistics of one database, the server's settings and its postmaster pid (for `/proc` CPU).
 * Each call opens its own short-lived admin connection, never during a measured interval.
 */
import { existsSync, readFileSync } from "node:fs"
import { join } from "node:path"
import * as EmbeddedPostgres from "@awa/testing/EmbeddedPostgres"
import { Effect } from "effect"
import { withClient } from "../lib.ts"

export const currentLsn = (serverUrl: string) =>
  withClient(serverUrl, (sql) =>
    Effect.map(sql<{ lsn: string }>`SELECT pg_current_wal_lsn()::text AS lsn`, (rows) => rows[0]!.lsn)
  )

export const walBytes = (serverUrl: string, from: string, to: string) =>
  withClient(serverUrl, (sql) =>
    Effect.map(
      sql<{ bytes: bigint }>`SELECT pg_wal_lsn_diff(${to}::pg_lsn, ${from}::pg_lsn)::bigint AS bytes`,
      (rows) => Number(rows[0]!.bytes)
    )
  )

/** `CHECKPOINT`, so a phase starts with no full-page images owed; false without the right to. */
export const checkpoint = (serverUrl: string) =>
  withClient(serverUrl, (sql) => sql.unsafe("CHECKPOINT").unprepared).pipe(
    Effect.as(true),
    Effect.catch(() => Effect.succeed(false))
  )

export const analyze = (dbUrl: string) => withClient(dbUrl, (sql) => sql.unsafe("ANALYZE").unprepared)

export interface TableStats {
  readonly ins: number
  readonly upd: number
  readonly hotUpd: number
  readonly del: number
  readonly dead: number
  readonly live: number
  readonly vacuums: number
}

/**
 * `pg_stat_user_tables` of the database at `dbUrl`, per table; Awa's ring children (`ready_3`)
 * and pg-boss's queue partitions are summed per family.
 */
export const tableStats = (dbUrl: string) =>
  withClient(dbUrl, (sql) =>
    Effect.map(
      sql<{
        family: string
        ins: bigint
        upd: bigint
        hot: bigint
        del: bigint
        dead: bigint
        live: bigint
        vacuums: bigint
      }>`
        SELECT schemaname || '.' || CASE WHEN schemaname = 'awa' THEN regexp_replace(relname, '_[0-9]+$', '')
                                         ELSE relname END AS family,
               sum(n_tup_ins)::bigint AS ins, sum(n_tup_upd)::bigint AS upd, sum(n_tup_hot_upd)::bigint AS hot,
               sum(n_tup_del)::bigint AS del, sum(n_dead_tup)::bigint AS dead, sum(n_live_tup)::bigint AS live,
               sum(vacuum_count + autovacuum_count)::bigint AS vacuums
        FROM pg_stat_user_tables GROUP BY 1 ORDER BY 1`,
      (rows) =>
        Object.fromEntries(
          rows.map((r): [string, TableStats] => [
            r.family,
            {
              ins: Number(r.ins),
              upd: Number(r.upd),
              hotUpd: Number(r.hot),
              del: Number(r.del),
              dead: Number(r.dead),
              live: Number(r.live),
              vacuums: Number(r.vacuums)
            }
          ])
        )
    )
  )

/** Settings recorded with every figure (issue 17): durability, JIT, memory, locks, isolation. */
const describedSettings = [
  "server_version",
  "server_version_num",
  "jit",
  "jit_above_cost",
  "jit_inline_above_cost",
  "jit_optimize_above_cost",
  "shared_buffers",
  "work_mem",
  "synchronous_commit",
  "fsync",
  "full_page_writes",
  "wal_level",
  "wal_compression",
  "max_wal_size",
  "checkpoint_timeout",
  "default_transaction_isolation",
  "max_locks_per_transaction",
  "max_connections",
  "autovacuum_naptime",
  "shared_preload_libraries"
]

/** The server a run (and each of its phases) ran on. */
export interface ServerDescription {
  /** `embedded`: the temporary server this run started; `external`: `--server` / `DATABASE_URL`. */
  readonly kind: "embedded" | "external"
  /** `SELECT version()`. */
  readonly version: string
  /** Whether JIT compilation can happen at all: `jit` on and the server built with LLVM (`pg_jit_available()`). */
  readonly jitActive: boolean
  /** `current_setting` of each of `describedSettings` (units as `SHOW` prints them). */
  readonly settings: Readonly<Record<string, string>>
}

export const serverDescription = (serverUrl: string, kind: ServerDescription["kind"]) =>
  withClient(serverUrl, (sql) =>
    Effect.gen(function* () {
      const rows = yield* sql<{ name: string; setting: string }>`
        SELECT name, current_setting(name) AS setting FROM pg_settings
        WHERE name IN ${sql.in(describedSettings)} ORDER BY name`
      const [info] = yield* sql<{ version: string; jit: boolean }>`
        SELECT version() AS version, pg_jit_available() AS jit`
      const settings = Object.fromEntries(rows.map((r) => [r.name, r.setting]))
      return {
        kind,
        version: info!.version,
        jitActive: settings.jit === "on" && info!.jit,
        settings
      } satisfies ServerDescription
    })
  )

/** One line for the stdout header: version, JIT, and the settings that move the figures most. */
export const renderServer = (d: ServerDescription): string => {
  const s = d.settings
  const jit = `jit ${s.jit}${s.jit === "on" ? (d.jitActive ? ` (active, jit_above_cost ${s.jit_above_cost})` : " (no LLVM: inactive)") : ""}`
  return [
    `PostgreSQL ${s.server_version} (${d.kind}): ${d.version}`,
    `  ${jit}; shared_buffers ${s.shared_buffers}, work_mem ${s.work_mem}, synchronous_commit ${s.synchronous_commit}, ` +
      `fsync ${s.fsync}, full_page_writes ${s.full_page_writes}, default_transaction_isolation ${s.default_transaction_isolation}, ` +
      `max_locks_per_transaction ${s.max_locks_per_transaction}, max_connections ${s.max_connections}`
  ].join("\n")
}

/**
 * The postmaster's pid: from the embedded server's data directory, or (`DATABASE_URL`) from
 * `postmaster.pid` in the server's `data_directory` when that is on this machine and readable.
 */
export const postmasterPid = (serverUrl: string, dataDir: string) =>
  Effect.gen(function* () {
    if (dataDir !== "") return EmbeddedPostgres.runningPostmaster(dataDir)
    const dir = yield* withClient(serverUrl, (sql) =>
      Effect.map(
        sql<{ dir: string }>`SELECT current_setting('data_directory') AS dir`,
        (rows) => rows[0]!.dir
      )
    ).pipe(Effect.catch(() => Effect.succeed(undefined)))
    if (dir === undefined) return undefined
    const file = join(dir, "postmaster.pid")
    if (!existsSync(file)) return undefined
    const pid = Number(readFileSync(file, "utf8").split("\n")[0])
    return Number.isInteger(pid) && pid > 0 ? pid : undefined
  }).pipe(Effect.catch(() => Effect.succeed(undefined)))

/** `pg_stat_statements` in the admin database, when the server preloads it; false otherwise. */
export const enableStatements = (serverUrl: string) =>
  withClient(
    serverUrl,
    (sql) => sql.unsafe("CREATE EXTENSION IF NOT EXISTS pg_stat_statements").unprepared
  ).pipe(
    Effect.andThen(withClient(serverUrl, (sql) => sql`SELECT 1 FROM pg_stat_statements LIMIT 1`)),
    Effect.as(true),
    Effect.catch(() => Effect.succeed(false))
  )

export const resetStatements = (serverUrl: string) =>
  withClient(serverUrl, (sql) => sql`SELECT pg_stat_statements_reset()`).pipe(Effect.asVoid)

export interface Statement {
  readonly query: string
  readonly calls: number
  readonly execMs: number
  readonly planMs: number
  readonly rows: number
  /** (exec + plan) ms per 1,000 jobs. */
  readonly msPer1000Jobs: number
}

/** The statements of database `dbUrl` by total (planning + execution) time, top `limit`. */
export const topStatements = (serverUrl: string, dbUrl: string, jobs: number, limit = 15) =>
  withClient(serverUrl, (sql) =>
    Effect.map(
      sql<{ query: string; calls: bigint; exec: number; plan: number; rows: bigint }>`
        SELECT regexp_replace(query, '\\s+', ' ', 'g') AS query, calls, total_exec_time AS exec,
               total_plan_time AS plan, rows
        FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
        WHERE d.datname = ${new URL(dbUrl).pathname.slice(1)}
        ORDER BY total_exec_time + total_plan_time DESC LIMIT ${limit}`,
      (rows) =>
        rows.map(
          (r): Statement => ({
            query: r.query.slice(0, 160),
            calls: Number(r.calls),
            execMs: Math.round(r.exec),
            planMs: Math.round(r.plan),
            rows: Number(r.rows),
            msPer1000Jobs: jobs === 0 ? 0 : Math.round(((r.exec + r.plan) * 1000) / jobs)
          })
        )
    )
  )

export interface Residue {
  /** `n_dead_tup` per table family of the database, plus `pg_catalog.pg_class`. */
  readonly dead: Record<string, number>
  /** Total relation size (heap + indexes + TOAST) per table family of the system, bytes. */
  readonly bytes: Record<string, number>
  /** Age in transactions of the oldest snapshot held in this database (the pinned reader's). */
  readonly xminAge: number | null
}

/** Dead tuples and sizes per table family, and the oldest xmin of the database at `dbUrl`. */
export const residue = (dbUrl: string) =>
  withClient(dbUrl, (sql) =>
    Effect.gen(function* () {
      const tables = yield* sql<{ family: string; dead: bigint; bytes: bigint }>`
        SELECT s.schemaname || '.' || CASE WHEN s.schemaname = 'awa' THEN regexp_replace(s.relname, '_[0-9]+$', '')
                                           ELSE s.relname END AS family,
               sum(s.n_dead_tup)::bigint AS dead, sum(pg_total_relation_size(s.relid))::bigint AS bytes
        FROM pg_stat_all_tables s
        WHERE s.schemaname NOT IN ('pg_toast', 'information_schema')
          AND (s.schemaname <> 'pg_catalog' OR s.relname = 'pg_class')
        GROUP BY 1 ORDER BY 1`
      const [xmin] = yield* sql<{ age: number | null }>`
        SELECT max(age(backend_xmin))::int AS age FROM pg_stat_activity
        WHERE datname = current_database() AND pid <> pg_backend_pid()`
      return {
        dead: Object.fromEntries(tables.map((t) => [t.family, Number(t.dead)])),
        bytes: Object.fromEntries(
          tables.filter((t) => !t.family.startsWith("pg_catalog.")).map((t) => [t.family, Number(t.bytes)])
        ),
        xminAge: xmin?.age ?? null
      } satisfies Residue
    })
  )
