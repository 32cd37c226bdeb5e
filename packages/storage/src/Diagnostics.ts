/**
 * Read-only diagnostics for operators (issue 18; docs/adr/0024-operator-surface.md): the storage
 * report behind `awa status` and the server checks behind `awa doctor`. Postgres only; nothing
 * here writes, and nothing reads job rows (catalogs, ring ledgers, `pg_settings`, `pg_locks`,
 * `pg_stat_activity`).
 */
import { Migrations } from "@awa/sql"
import { Effect } from "effect"
import { SqlClient, type SqlError } from "effect/sql"

export interface RingReport {
  readonly ring: "queue" | "history"
  readonly generation: bigint
  readonly slot: number
  /** Oldest incarnation not yet reclaimed, its slot, and when it became current. */
  readonly oldestUnpruned: {
    readonly generation: bigint
    readonly slot: number
    readonly since: Date | null
  } | null
  readonly lastPrunedAt: Date | null
  /**
   * The leader's last prune outcome for this ring and since when (migration 0031: written when it
   * changes): `ok`, or `blocked` with the reason (`lock`, `busy`, `unclaimed`, `retention`, …).
   * `null` until a leader has pruned once on this schema.
   */
  readonly prune: { readonly outcome: string; readonly reason: string | null; readonly since: Date } | null
  /** Bytes on disk of the ring's tables, summed over its children (tables and indexes). */
  readonly bytes: number
}

export interface StorageReport {
  readonly schema: string
  readonly schemaVersion: number
  readonly latestVersion: number
  readonly now: Date
  /** The session holding the maintenance leader's lock, if any. */
  readonly leader: {
    readonly pid: number
    readonly applicationName: string
    readonly since: Date | null
  } | null
  readonly rings: ReadonlyArray<RingReport>
  /** Bytes of the plain tables that grow with pending work (deferred, dlq, parked, …). */
  readonly tables: ReadonlyArray<{ readonly table: string; readonly bytes: number }>
}

export type CheckStatus = "pass" | "warn" | "fail"

export interface DoctorCheck {
  readonly name: string
  readonly status: CheckStatus
  /** What was found. */
  readonly detail: string
  /** What to do about a warn or fail; empty on pass. */
  readonly fix: string
}

/** The migration that added `maintenance_state`. */
const pruneStateVersion = 31

const leaderKey = (schema: string) => `awa:leader:${schema}`

const ringReport = (sql: SqlClient.SqlClient, schema: string, ring: "queue" | "history") =>
  Effect.map(
    sql<{
      generation: bigint
      slot: number
      oldest: bigint | null
      oldest_since: Date | null
      last_pruned: Date | null
      bytes: bigint
    }>`
      WITH cur AS (SELECT * FROM ${sql(schema)}.ring_current(${ring})),
      oldest AS (
        SELECT min(g.g) AS g FROM cur, generate_series(greatest(0, cur.generation - ${sql(schema)}.ring_slots(${ring}) + 1),
                                                        cur.generation - 1) AS g(g)
        WHERE NOT EXISTS (SELECT 1 FROM ${sql(schema)}.ring_prunes p WHERE p.ring = ${ring} AND p.generation = g.g)
      )
      SELECT cur.generation, cur.slot, oldest.g AS oldest,
             (SELECT r.rotated_at FROM ${sql(schema)}.ring_rotations r WHERE r.ring = ${ring} AND r.generation = oldest.g) AS oldest_since,
             (SELECT max(p.pruned_at) FROM ${sql(schema)}.ring_prunes p WHERE p.ring = ${ring}) AS last_pruned,
             (SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0)::bigint FROM pg_class c
              JOIN pg_namespace n ON n.oid = c.relnamespace
              WHERE n.nspname = ${schema} AND c.relkind = 'r'
                AND c.relname ~ ${ring === "queue" ? "^(ready|ready_tombstones|claims|claim_marks|claim_spans|closures|terminal)_[0-9]+$" : "^history_[0-9]+$"}) AS bytes
      FROM cur, oldest`,
    (rows): RingReport => {
      const r = rows[0]!
      const slots = ring === "queue" ? 16 : 32
      return {
        ring,
        generation: r.generation,
        slot: r.slot,
        oldestUnpruned:
          r.oldest === null
            ? null
            : { generation: r.oldest, slot: Number(r.oldest % BigInt(slots)), since: r.oldest_since },
        lastPrunedAt: r.last_pruned,
        prune: null,
        bytes: Number(r.bytes)
      }
    }
  )

/** Schema version, leader, both rings and the sizes of the mutable tables. */
export const storageReport = Effect.fn("Diagnostics.storageReport")(function* (
  options: { readonly schema?: string | undefined } = {}
) {
  const schema = yield* Migrations.checkSchemaName(options.schema ?? Migrations.defaultSchema)
  const sql = yield* SqlClient.SqlClient
  const schemaVersion = yield* Migrations.currentVersion({ schema })
  const [now] = yield* sql<{ now: Date }>`SELECT now() AS now`
  const [leader] = yield* sql<{ pid: number; application_name: string; backend_start: Date | null }>`
    SELECT a.pid, a.application_name, a.backend_start FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
    WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND ((l.classid::bigint << 32) | l.objid::bigint) = hashtextextended(${leaderKey(schema)}, 0)
    LIMIT 1`
  const installed = schemaVersion > 0
  // the prune state the leader records on change (migration 0031; absent on an older schema)
  const states =
    schemaVersion >= pruneStateVersion
      ? yield* sql<{ ring: string; outcome: string; reason: string | null; since: Date }>`
          SELECT ring, outcome, reason, since FROM ${sql(schema)}.maintenance_state`
      : []
  const rings = installed
    ? [yield* ringReport(sql, schema, "queue"), yield* ringReport(sql, schema, "history")].map(
        (ring): RingReport => {
          const state = states.find((x) => x.ring === ring.ring)
          return state === undefined
            ? ring
            : { ...ring, prune: { outcome: state.outcome, reason: state.reason, since: state.since } }
        }
      )
    : []
  const tables = installed
    ? yield* sql<{ table: string; bytes: bigint }>`
        SELECT c.relname AS table, pg_total_relation_size(c.oid)::bigint AS bytes FROM pg_class c
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = ${schema} AND c.relkind = 'r' AND c.relname !~ '_[0-9]+$'
        ORDER BY 1`
    : []
  return {
    schema,
    schemaVersion,
    latestVersion: Migrations.latestVersion(),
    now: now!.now,
    leader:
      leader === undefined
        ? null
        : { pid: leader.pid, applicationName: leader.application_name, since: leader.backend_start },
    rings,
    tables: tables.map((t) => ({ table: t.table, bytes: Number(t.bytes) }))
  } satisfies StorageReport
})

const check = (
  name: string,
  ok: boolean,
  detail: string,
  fix: string,
  failing: CheckStatus = "warn"
): DoctorCheck => (ok ? { name, status: "pass", detail, fix: "" } : { name, status: failing, detail, fix })

/** How long a transaction may stay open before it is reported as holding back reclamation. */
export const longTransactionMs = 60_000

/**
 * Server checks, each pass/warn/fail with its fix: version, schema, JIT, default isolation, lock
 * budget, privileges, transactions old enough to hold back ring reclamation, and whether inserts
 * skip wake-ups nobody waits for (migration 0051).
 */
export const doctor = Effect.fn("Diagnostics.doctor")(function* (
  options: { readonly schema?: string | undefined } = {}
) {
  const schema = yield* Migrations.checkSchemaName(options.schema ?? Migrations.defaultSchema)
  const sql = yield* SqlClient.SqlClient
  const settings = yield* sql<{ name: string; setting: string }>`
    SELECT name, setting FROM pg_settings
    WHERE name IN ('server_version_num', 'server_version', 'jit', 'default_transaction_isolation',
                   'max_locks_per_transaction', 'max_connections', 'idle_in_transaction_session_timeout')`
  const get = (name: string) => settings.find((s) => s.name === name)?.setting ?? ""
  const versionNum = Number(get("server_version_num"))
  const version = yield* Migrations.currentVersion({ schema })
  const latest = Migrations.latestVersion()
  const [privileges] = yield* sql<{ create_db: boolean; create_schema: boolean; owner: boolean | null }>`
    SELECT has_database_privilege(current_database(), 'CREATE') AS create_db,
           has_database_privilege(current_database(), 'CREATE') AS create_schema,
           (SELECT pg_has_role(n.nspowner, 'USAGE') FROM pg_namespace n WHERE n.nspname = ${schema}) AS owner`
  const long = yield* sql<{ pid: number; state: string; age_ms: number; query: string }>`
    SELECT a.pid, coalesce(a.state, '') AS state,
           (extract(epoch FROM now() - a.xact_start) * 1000)::float8 AS age_ms, left(coalesce(a.query, ''), 80) AS query
    FROM pg_stat_activity a
    WHERE a.xact_start IS NOT NULL AND a.pid <> pg_backend_pid() AND a.backend_type = 'client backend'
      AND now() - a.xact_start > ${longTransactionMs} * interval '1 millisecond'
    ORDER BY a.xact_start LIMIT 5`
  const locks = Number(get("max_locks_per_transaction"))
  const isolation = get("default_transaction_isolation")
  // migration 0051's setting; a schema without it notifies on every insert, as when it is off
  const [wake] =
    version >= 51
      ? yield* sql<{ on: boolean }>`SELECT ${sql(schema)}.wake_on_demand() AS on`
      : [{ on: false }]
  return [
    check(
      "server version",
      versionNum >= 140000 && versionNum < 190000,
      `PostgreSQL ${get("server_version")}`,
      "use PostgreSQL 14 to 18",
      "fail"
    ),
    check(
      "schema",
      version === latest,
      version === 0
        ? `schema "${schema}" not installed`
        : `schema "${schema}" at version ${version} (this code: ${latest})`,
      version > latest ? "upgrade this Awa before running it on the newer schema" : "run: awa migrate",
      "fail"
    ),
    check(
      "jit",
      get("jit") === "off",
      `jit = ${get("jit")}`,
      "Awa's functions turn JIT off for themselves; your own queries on large ring partitions may pay JIT compile time: ALTER SYSTEM SET jit = off (or per role) if they do"
    ),
    check(
      "default isolation",
      isolation === "read committed",
      `default_transaction_isolation = ${isolation}`,
      "Awa's storage runs its own calls at READ COMMITTED; enqueue inside a stricter transaction defers jobs (scheduled, promoted later): ALTER ROLE … SET default_transaction_isolation = 'read committed' for the worker's role"
    ),
    check(
      "lock budget",
      locks >= 64,
      `max_locks_per_transaction = ${locks}, max_connections = ${get("max_connections")}`,
      "raise max_locks_per_transaction to at least 64 (server restart)"
    ),
    check(
      "privileges",
      privileges?.owner === true || (privileges?.owner === null && privileges.create_db),
      privileges?.owner === null
        ? `schema "${schema}" absent; CREATE on the database: ${privileges.create_db}`
        : `member of the owner of schema "${schema}": ${privileges?.owner}`,
      "run migrations and workers as the schema's owner (or a member of its role)",
      "fail"
    ),
    check(
      "long transactions",
      long.length === 0,
      long.length === 0
        ? `no transaction open longer than ${longTransactionMs / 1000} s`
        : long
            .map((l) => `pid ${l.pid} ${l.state} for ${Math.round(l.age_ms / 1000)} s: ${l.query}`)
            .join("; "),
      "a long transaction holding a ring slot blocks its reclamation (idle in transaction: prune ends it after a while); end it (pg_terminate_backend(pid)) or set idle_in_transaction_session_timeout"
    ),
    check(
      "wake-ups on demand",
      wake?.on === true,
      wake?.on === true
        ? "on: inserts notify only while a worker waits for work"
        : "off: every insert notifies, and its commit queues on the cluster's notification lock",
      "once every worker runs this version: awa wake-on-demand on (docs/adr/0038-wake-ups-on-demand.md)"
    )
  ] satisfies ReadonlyArray<DoctorCheck>
})

export type DiagnosticsError = SqlError.SqlError
