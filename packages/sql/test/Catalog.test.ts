/**
 * Catalog rules every function of ours must follow, whatever migration last (re)defined it
 * (issue 13, docs/adr/0021-server-defaults.md). CREATE OR REPLACE replaces a function's SET clauses
 * and a new function starts executable by PUBLIC, so these are checked on the installed catalog,
 * for every function in the schema, and each failure names the function:
 *
 * - every PL/pgSQL function runs with `search_path = <schema>, pg_catalog` and `jit = off`, except
 *   the few listed in `inheritsCallerSettings` (called only inside a function that sets both, whose
 *   settings then apply), which must reference only schema-qualified objects, as below;
 * - an SQL-language function without that search_path (kept without SET clauses so it can be
 *   inlined) references only schema-qualified objects: called with a search_path that does not
 *   contain the schema, it still runs;
 * - no function is executable by PUBLIC;
 * - every PL/pgSQL function refuses to run outside READ COMMITTED (SQLSTATE AWI01, migration
 *   0027), except the few listed in `isolationAgnostic`, each with the reason it is safe;
 * - installed in a schema with another name, no function names the default one.
 *
 * Checked for the default schema and for a schema with another name (the migrations spell it
 * `:AWA_SCHEMA`). Each rule also has a negative control: a function that breaks it is reported.
 */
import { TestDatabase } from "@awa/testing"
import { assert, describe, it } from "@effect/vitest"
import { Cause, Effect, Exit, Option } from "effect"
import { SqlClient } from "effect/sql"
import { migrate } from "../src/Migrations.ts"

/**
 * PL/pgSQL functions without the READ COMMITTED check, and why each may run at any level. A new
 * function is checked unless it is added here, with its reason.
 */
const isolationAgnostic: Record<string, string> = {
  enqueue: "runs in the caller's transaction: outside READ COMMITTED it defers the job (0018)",
  enqueue_one: "as enqueue",
  enqueue_batch: "as enqueue",
  shard_for:
    "reads one queue_meta row and draws from a sequence; called inside retry functions that check the level (0042)",
  shard_draw:
    "a sequence draw kept in a transaction-local setting, no table; called inside enqueue_one and enqueue_batch (0042)",
  set_wake_on_demand: "replaces one constant function (DDL, the same at any level), reads no table (0051)",
  lane_cursor: "a read, called only inside checked functions",
  queue_slot_ranges: "a read, called only inside checked functions",
  key_grants_in_slot:
    "a read of one slot's grants in the caller's snapshot (STABLE), called only inside claim_keyed (0059)",
  queue_stats: "a read of one statement (one snapshot at any level) that writes nothing (0030)",
  queue_rates: "a read of one statement that writes nothing (0031)",
  queue_history: "a read of one statement that writes nothing (0031)",
  queue_depth: "a capped count of one statement (one snapshot at any level) that writes nothing (0032)",
  slot_has_unclaimed: "a read, called only inside prune_queue",
  end_idle_blockers: "reads pg_locks and pg_stat_activity (no MVCC snapshot); called only inside prune_queue",
  cron_upsert: "one INSERT … ON CONFLICT on cron_schedules, correct at any level",
  cron_mark_stale: "one UPDATE of cron_schedules",
  cron_set_paused: "one UPDATE of cron_schedules",
  cron_remove: "one DELETE of cron_schedules"
}

/**
 * PL/pgSQL functions without SET clauses, and why: each is called only inside a function that
 * sets `search_path` and `jit` (and its plan settings) and checks the isolation level, which
 * then hold for it, and a SET clause would cost every call a save and restore of each setting.
 * Matched by name; each must set nothing and run with `search_path = pg_catalog` (it names only
 * schema-qualified objects).
 */
const inheritsCallerSettings: ReadonlyArray<readonly [RegExp, string]> = [
  [
    /^lane_picks_\d+$/,
    "one slot's pick, a read called only inside claim, once per live slot and call (0063)"
  ],
  [
    /^lane_heads_\d+$/,
    "one slot's lane heads, a read called only inside claim's ranking, once per live slot and call (0066)"
  ],
  [
    /^(closures_of|ready_rows_of)_\d+$/,
    "one slot's reads of a batch, called only inside finalize_completions (0064)"
  ]
]

const inherits = (name: string) => inheritsCallerSettings.some(([pattern]) => pattern.test(name))

interface FunctionRow {
  readonly sig: string
  readonly language: string
  readonly config: ReadonlyArray<string> | null
  readonly public_execute: boolean
  readonly args: ReadonlyArray<string>
  readonly returns_set: boolean
  readonly name: string
  readonly source: string
}

const functionsOf = (schema: string) =>
  Effect.flatMap(
    SqlClient.SqlClient,
    (sql) => sql<FunctionRow>`
      SELECT p.oid::regprocedure::text AS sig, l.lanname AS language, p.proconfig AS config,
             has_function_privilege('public', p.oid, 'EXECUTE') AS public_execute,
             ARRAY(SELECT format_type(t, NULL) FROM unnest(p.proargtypes) AS t) AS args,
             p.proretset AS returns_set, p.proname AS name, p.prosrc AS source
      FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace JOIN pg_language l ON l.oid = p.prolang
      WHERE n.nspname = ${schema}
      ORDER BY 1`
  )

/** The function's name and argument types, schema-qualified (regprocedure text drops a visible schema). */
const qualified = (schema: string, sig: string) => (sig.startsWith(`${schema}.`) ? sig : `${schema}.${sig}`)

/**
 * The check as the first statement of the body (migration 0027): the first thing after the
 * body's first BEGIN line is the isolation test, and it raises AWI01. Anywhere else in the body
 * it could run after a write.
 */
const refusesOtherLevels = (source: string) => {
  const afterBegin = source.slice(source.search(/^BEGIN\s*$/m))
  const firstStatement = afterBegin
    .split("\n")
    .slice(1)
    .find((line) => !/^\s*(--.*)?$/.test(line))
  return (
    firstStatement?.trim() === "IF current_setting('transaction_isolation') <> 'read committed' THEN" &&
    /USING ERRCODE = 'AWI01'/.test(afterBegin.slice(0, 600))
  )
}

const rollback = Symbol("rollback")

/**
 * Calls `f` with NULL arguments and `search_path = pg_catalog` (counting its rows: its answer may be of
 * a type of the schema the driver cannot decode), in a transaction that is always
 * rolled back; the error's message when the call fails.
 */
const callOutsideSchema = (schema: string, f: FunctionRow) =>
  Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    const name = qualified(schema, f.sig).replace(/\(.*$/, "")
    const call = `SELECT count(*) FROM ${name}(${f.args.map((t) => `NULL::${t}`).join(", ")})`
    const exit = yield* Effect.exit(
      sql.withTransaction(
        Effect.gen(function* () {
          yield* sql.unsafe("SET LOCAL search_path = pg_catalog").unprepared
          yield* sql.unsafe(call).unprepared
          return yield* Effect.fail(rollback)
        })
      )
    )
    if (Exit.isSuccess(exit)) return undefined
    const error = Option.getOrUndefined(Cause.findErrorOption(exit.cause))
    return error === rollback ? undefined : String(error ?? exit.cause)
  })

/**
 * A body that names the default schema, in a dynamic statement's text (`format('%I…', 'awa')`) or
 * qualified (`awa.ready`): installed under another name, it reads or writes the default schema's
 * tables (0039-0052's prune_queue locked and truncated a slot of `awa`, 0053). Not the names that
 * only start with it: the `awa.concurrency-key.v1` digest prefix, the `awa.claim_keyed` and
 * `awa.shard_draw` settings.
 */
const namesDefaultSchema = /'awa'|"awa"|\bawa\.(?!concurrency-key|claim_keyed|shard_draw)[a-z_]/

/** Every rule broken, one line per function and rule. */
const problems = (schema: string) =>
  Effect.gen(function* () {
    const found: Array<string> = []
    for (const f of yield* functionsOf(schema)) {
      const config = f.config ?? []
      const pinned = config.includes(`search_path=${schema}, pg_catalog`)
      if (f.language === "plpgsql" && inherits(f.name)) {
        if (config.length > 0)
          found.push(`${f.sig}: listed as inheriting its caller's settings, but sets ${config}`)
        const error = yield* callOutsideSchema(schema, f)
        if (error !== undefined) found.push(`${f.sig}: fails outside its schema's search_path: ${error}`)
      } else if (f.language === "plpgsql") {
        if (!pinned) found.push(`${f.sig}: no SET search_path = ${schema}, pg_catalog`)
        if (!config.includes("jit=off")) found.push(`${f.sig}: no SET jit = off`)
        if (!refusesOtherLevels(f.source) && !(f.name in isolationAgnostic))
          found.push(`${f.sig}: does not refuse other isolation levels than READ COMMITTED (AWI01)`)
      } else if (f.language === "sql" && !pinned) {
        const error = yield* callOutsideSchema(schema, f)
        if (error !== undefined) found.push(`${f.sig}: fails outside its schema's search_path: ${error}`)
      }
      if (f.public_execute) found.push(`${f.sig}: executable by PUBLIC`)
      if (schema !== "awa" && namesDefaultSchema.test(f.source))
        found.push(`${f.sig}: names the default schema "awa" (the migrations spell it :AWA_SCHEMA)`)
    }
    return found
  })

describe("catalog rules for every function", () => {
  it.live("hold in the default schema", () =>
    Effect.gen(function* () {
      assert.deepStrictEqual(yield* problems("awa"), [])
    }).pipe(Effect.provide(TestDatabase.layer()))
  )

  it.live("hold in a schema with another name", () =>
    Effect.gen(function* () {
      yield* migrate({ schema: "jobs_custom" })
      assert.deepStrictEqual(yield* problems("jobs_custom"), [])
    }).pipe(Effect.provide(TestDatabase.layer({ migrated: false })))
  )

  it.live("report a function that breaks them, by name", () =>
    Effect.gen(function* () {
      const sql = yield* SqlClient.SqlClient
      // what a later migration could write by mistake: no SET clauses, no REVOKE
      yield* sql.unsafe(
        `CREATE FUNCTION awa.careless_plpgsql() RETURNS int LANGUAGE plpgsql AS $$ BEGIN RETURN 1; END $$`
      ).unprepared
      // (its body is not checked at creation: the migrating session's search_path could have held
      // the schema, and a later caller's does not)
      yield* sql.withTransaction(
        Effect.andThen(
          sql.unsafe("SET LOCAL check_function_bodies = off").unprepared,
          sql.unsafe(
            `CREATE FUNCTION awa.careless_sql(p_queue text) RETURNS boolean LANGUAGE sql STABLE AS $$
               SELECT EXISTS (SELECT 1 FROM queue_meta m WHERE m.queue = p_queue) $$`
          ).unprepared
        )
      )
      yield* sql.unsafe(`REVOKE EXECUTE ON FUNCTION awa.careless_sql(text) FROM PUBLIC`).unprepared
      // a function named as one that inherits its caller's settings, which sets one anyway and names
      // a table without its schema
      yield* sql.unsafe(
        `CREATE FUNCTION awa.lane_picks_99() RETURNS int LANGUAGE plpgsql SET jit = off
           AS $$ BEGIN RETURN (SELECT count(*) FROM queue_meta); END $$`
      ).unprepared
      yield* sql.unsafe(`REVOKE EXECUTE ON FUNCTION awa.lane_picks_99() FROM PUBLIC`).unprepared
      const found = yield* problems("awa")
      assert.deepStrictEqual(
        found.map((line) => line.replace(/: fails outside its schema's search_path: .*/, ": fails outside")),
        [
          "awa.careless_plpgsql(): no SET search_path = awa, pg_catalog",
          "awa.careless_plpgsql(): no SET jit = off",
          "awa.careless_plpgsql(): does not refuse other isolation levels than READ COMMITTED (AWI01)",
          "awa.careless_plpgsql(): executable by PUBLIC",
          "awa.careless_sql(text): fails outside",
          "awa.lane_picks_99(): listed as inheriting its caller's settings, but sets jit=off",
          "awa.lane_picks_99(): fails outside"
        ]
      )
    }).pipe(Effect.provide(TestDatabase.layer()))
  )
})
