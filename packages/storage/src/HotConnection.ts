/**
 * A connection of the storage layer's own for one hot statement (`claim`, `finalize`), so that
 * one backend plans it instead of every pooled one (docs/adr/0033-hot-path-on-few-connections.md).
 *
 * **Why** A statement's first plan on a backend loads the relation cache of every ring child it
 * names (claim 27–33 ms, finalize 40–60 ms), and each prune's `TRUNCATE` invalidates the plan
 * again. The application's pool hands out its idle connections first-in first-out, so through
 * the pool every connection plans every hot statement, after every prune, on the path of a job
 * waiting to start. On a connection of its own a statement is planned once per prune.
 *
 * **Guarantees**
 * - A call runs on the dedicated connection only when that connection is free and the fiber is
 *   not in a transaction. Otherwise it takes `viaPool`, the call as it ran before this module, so
 *   concurrent callers never queue behind one another and a caller's transaction is joined.
 * - The connection is opened on first use (a producer-only process never opens one), with the
 *   application's `PgClient` settings, `application_name` "<name> <role>" and
 *   `default_transaction_isolation` READ COMMITTED in its startup packet (the SQL functions
 *   refuse other levels, migration 0027; a session of our own need not inherit the pool's).
 * - Any failure or interruption of a call on it closes it (an interrupted query may leave a late
 *   cancel behind; a failed one may have lost its socket); the next call opens a new one.
 * - A call that failed because the connection was lost (SQLSTATE class 08, or 57P: terminated
 *   by an operator or a shutdown) is run once more through the pool. Both hot calls may be
 *   repeated: a claim whose answer was lost leaves attempts that rescue reclaims, and finalize is
 *   guarded by `(job_id, run_lease)` (an item applied by the lost call answers stale).
 * - Closing the layer's scope closes the connection.
 *
 * **Gotchas**
 * - One more server connection per role and per worker process (two with claim and finalize),
 *   outside the application's pool and its `maxConnections`.
 * - `connectionTTL` of the pool does not apply to it; it lives until it fails or the layer ends.
 */
import { PgClient, PgConnection } from "@effect/sql-pg"
import { Effect, Exit, Option, Scope } from "effect"
import { SqlClient, type SqlError, Statement } from "effect/sql"

/** Runs a statement on the dedicated connection when it can, else as `viaPool`. */
export interface HotConnection {
  readonly run: <A extends object, E, R>(
    statement: Statement.Statement<A>,
    viaPool: Effect.Effect<ReadonlyArray<A>, E, R>
  ) => Effect.Effect<ReadonlyArray<A>, E | SqlError.SqlError, R>
}

/** No dedicated connection: every call takes `viaPool`. */
export const none: HotConnection = { run: (_statement, viaPool) => viaPool }

interface Open {
  readonly connection: PgConnection.PgConnection
  readonly scope: Scope.Closeable
}

const sqlState = (error: SqlError.SqlError): string | undefined => {
  const code = (error.reason as { cause?: { code?: unknown } }).cause?.code
  return typeof code === "string" ? code : undefined
}

/** The connection itself was lost, not the statement refused: the call may go to the pool. */
export const isConnectionLost = (error: SqlError.SqlError): boolean => {
  if (error.reason._tag === "ConnectionError") return true
  const code = sqlState(error)
  return code !== undefined && (code.startsWith("08") || code.startsWith("57P"))
}

/**
 * The dedicated connection for one role, in the current scope.
 *
 * `role` names it in `pg_stat_activity` ("awa claim"); `client` gives the connection settings
 * and `sql` the transaction in progress, if any.
 */
export const make = Effect.fnUntraced(function* (options: {
  readonly role: string
  readonly client: PgClient.PgClient
  readonly sql: SqlClient.SqlClient
}) {
  const { client, sql } = options
  const layerScope = yield* Effect.scope
  const config: PgConnection.Config = {
    ...client.config,
    applicationName: `${client.config.applicationName ?? "awa"} ${options.role}`,
    startupParameters: {
      ...client.config.startupParameters,
      default_transaction_isolation: "read committed"
    }
  }
  let open: Open | undefined
  // One call at a time: JavaScript runs this check and set without a yield in between.
  let busy = false

  const connect = Effect.gen(function* () {
    const scope = yield* Scope.fork(layerScope)
    const connection = yield* PgConnection.make(config).pipe(
      Scope.provide(scope),
      Effect.onError(() => Scope.close(scope, Exit.void))
    )
    open = { connection, scope }
    return open
  })

  const close = Effect.suspend(() => {
    const closing = open
    open = undefined
    return closing === undefined ? Effect.void : Scope.close(closing.scope, Exit.void)
  })

  // The span a statement through the pool gets (`@effect/sql-pg`'s attributes), so that traces
  // look the same whichever connection ran the call.
  const spanAttributes: Record<string, unknown> = {
    ...client.config.spanAttributes,
    "db.system.name": "postgresql",
    "db.namespace": client.config.database ?? client.config.username ?? "postgres",
    "server.address": client.config.host ?? "localhost",
    "server.port": client.config.port ?? 5432,
    "effect.sql.method": "execute"
  }
  const spanName = Statement.spanName(Object.entries(spanAttributes))

  const onDedicated = <A extends object>(statement: Statement.Statement<A>) => {
    const [text, params] = statement.compile()
    return Effect.gen(function* () {
      const { connection } = open ?? (yield* connect)
      const result = yield* connection.query(text, params)
      return result.rows as ReadonlyArray<A>
    }).pipe(
      Effect.onExit((exit) => (Exit.isSuccess(exit) ? Effect.void : close)),
      Effect.ensuring(Effect.sync(() => (busy = false))),
      Effect.withSpan(
        spanName,
        { kind: "client", attributes: { ...spanAttributes, "db.query.text": text } },
        { captureStackTrace: false }
      )
    )
  }

  const run: HotConnection["run"] = (statement, viaPool) =>
    Effect.flatMap(Effect.serviceOption(sql.transactionService), (transaction) => {
      if (busy || Option.isSome(transaction)) return viaPool
      busy = true
      return Effect.catchIf(onDedicated(statement), isConnectionLost, () => viaPool)
    })

  yield* Effect.addFinalizer(() => close)
  return { run } satisfies HotConnection
})

/**
 * The dedicated connection for `role` in the current scope, or `none` when `enabled` is `false`
 * or the `SqlClient` is not `@effect/sql-pg`'s (no `PgClient` to take the settings from).
 */
export const forRole = Effect.fnUntraced(function* (role: string, enabled: boolean | undefined) {
  const sql = yield* SqlClient.SqlClient
  const client = yield* Effect.serviceOption(PgClient.PgClient)
  if (enabled === false || Option.isNone(client)) return none
  return yield* make({ role, client: client.value, sql })
})
