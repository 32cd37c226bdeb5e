/**
 * Connections of the storage layer's own for the hot statements (`claim`, `finalize`,
 * `claim_keyed`), so that one or two backends plan them instead of every pooled one
 * (docs/adr/0033-hot-path-on-few-connections.md).
 *
 * **Why** A statement's first plan on a backend loads the relation cache of every ring child it
 * names (claim 27–33 ms, finalize 40–60 ms), and each prune's `TRUNCATE` invalidates the plan
 * again. The application's pool hands out its idle connections first-in first-out, so through
 * the pool every connection plans every hot statement, after every prune, on the path of a job
 * waiting to start. On connections of their own a statement is planned once or twice per prune.
 *
 * **Guarantees**
 * - A call takes the first free connection of the set (`size`, default 2), lowest first, so a
 *   lightly loaded worker runs its claims and finalizations on one backend (measured: a claim
 *   that follows a finalization on another backend costs ~0.3 ms more) and a second one serves
 *   the overlap of a busy one. With all busy, or inside the caller's transaction, the call takes
 *   `viaPool`, the call as it ran before this module: nobody queues behind a slow call, and the
 *   caller's transaction is joined.
 * - A connection is opened on first use (a producer-only process opens none), with the
 *   application's `PgClient` settings, `application_name` "<name> hot <n>" and
 *   `default_transaction_isolation` READ COMMITTED in its startup packet (the SQL functions
 *   refuse other levels, migration 0027; a session of our own need not inherit the pool's).
 * - Any failure or interruption of a call on one closes it (an interrupted query may leave a late
 *   cancel behind; a failed one may have lost its socket); its next call opens a new one.
 * - A call that failed because the connection was lost (SQLSTATE class 08, or 57P: terminated
 *   by an operator or a shutdown) is run once more through the pool. The hot calls may be
 *   repeated: a claim whose answer was lost leaves attempts that rescue reclaims, and finalize is
 *   guarded by `(job_id, run_lease)` (an item applied by the lost call answers stale).
 * - Closing the scope that made the set closes its connections.
 *
 * **Gotchas**
 * - Up to `size` more server connections per worker process, outside the application's pool and
 *   its `maxConnections`.
 * - The pool's `connectionTTL` does not apply to them; they live until they fail or the set ends.
 */
import { PgClient, PgConnection } from "@effect/sql-pg"
import { Context, Effect, Exit, Layer, Option, Scope } from "effect"
import { SqlClient, type SqlError, Statement } from "effect/sql"

/** Runs a statement on a free connection of the set when it can, else as `viaPool`. */
export interface HotConnections {
  readonly run: <A extends object, E, R>(
    statement: Statement.Statement<A>,
    viaPool: Effect.Effect<ReadonlyArray<A>, E, R>
  ) => Effect.Effect<ReadonlyArray<A>, E | SqlError.SqlError, R>
}

/** The set a layer shares with the others built beside it (`Awa.layerPg` provides one). */
export const HotConnections = Context.Service<HotConnections>("@awa/storage/HotConnections")

/** No connections of its own: every call takes `viaPool`. */
export const none: HotConnections = { run: (_statement, viaPool) => viaPool }

/** Connections in a set unless told otherwise. */
export const defaultSize = 2

interface Open {
  readonly connection: PgConnection.PgConnection
  readonly scope: Scope.Closeable
}

interface Slot {
  readonly number: number
  open: Open | undefined
  busy: boolean // a call is on it
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
 * A set of `size` connections in the current scope, opened as calls need them. `client` gives the
 * connection settings and `sql` the transaction in progress, if any.
 */
export const make = Effect.fnUntraced(function* (options: {
  readonly client: PgClient.PgClient
  readonly sql: SqlClient.SqlClient
  readonly size?: number | undefined
}) {
  const { client, sql } = options
  const layerScope = yield* Effect.scope
  const configOf = (slot: Slot): PgConnection.Config => ({
    ...client.config,
    applicationName: `${client.config.applicationName ?? "awa"} hot ${slot.number}`,
    startupParameters: {
      ...client.config.startupParameters,
      default_transaction_isolation: "read committed"
    }
  })
  const slots: ReadonlyArray<Slot> = Array.from({ length: options.size ?? defaultSize }, (_, i) => ({
    number: i + 1,
    open: undefined,
    busy: false
  }))

  const connect = (slot: Slot) =>
    Effect.gen(function* () {
      const scope = yield* Scope.fork(layerScope)
      const connection = yield* PgConnection.make(configOf(slot)).pipe(
        Scope.provide(scope),
        Effect.onError(() => Scope.close(scope, Exit.void))
      )
      slot.open = { connection, scope }
      return slot.open
    })

  const close = (slot: Slot) =>
    Effect.suspend(() => {
      const closing = slot.open
      slot.open = undefined
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

  const onSlot = <A extends object>(slot: Slot, statement: Statement.Statement<A>) => {
    const [text, params] = statement.compile()
    return Effect.gen(function* () {
      const { connection } = slot.open ?? (yield* connect(slot))
      const result = yield* connection.query(text, params)
      return result.rows as ReadonlyArray<A>
    }).pipe(
      Effect.onExit((exit) => (Exit.isSuccess(exit) ? Effect.void : close(slot))),
      Effect.withSpan(
        spanName,
        { kind: "client", attributes: { ...spanAttributes, "db.query.text": text } },
        { captureStackTrace: false }
      )
    )
  }

  // Taking a slot is the acquire step (uninterruptible, no yield between the test and the set):
  // an interruption can never leave one marked busy for good.
  const take = Effect.sync(() => {
    const slot = slots.find((s) => !s.busy)
    if (slot !== undefined) slot.busy = true
    return slot
  })
  const give = (slot: Slot | undefined) =>
    slot === undefined
      ? Effect.void
      : Effect.sync(() => {
          slot.busy = false
        })

  const run: HotConnections["run"] = (statement, viaPool) =>
    Effect.flatMap(Effect.serviceOption(sql.transactionService), (transaction) =>
      Option.isSome(transaction)
        ? viaPool
        : Effect.acquireUseRelease(
            take,
            (slot) =>
              slot === undefined
                ? viaPool
                : Effect.catchIf(onSlot(slot, statement), isConnectionLost, () => viaPool),
            give
          )
    )

  yield* Effect.addFinalizer(() => Effect.forEach(slots, close, { discard: true }))
  return { run } satisfies HotConnections
})

/**
 * A set in the current scope, or `none` when `enabled` is `false` or the `SqlClient` is not
 * `@effect/sql-pg`'s (no `PgClient` to take the settings from).
 */
export const makeFor = Effect.fnUntraced(function* (enabled: boolean | undefined) {
  const sql = yield* SqlClient.SqlClient
  const client = yield* Effect.serviceOption(PgClient.PgClient)
  if (enabled === false || Option.isNone(client)) return none
  return yield* make({ client: client.value, sql })
})

/**
 * The set a storage layer uses: the `HotConnections` in context (shared with the layers beside
 * it), else one of its own.
 */
export const forLayer = (enabled: boolean | undefined) =>
  Effect.flatMap(Effect.serviceOption(HotConnections), (shared) =>
    enabled === false
      ? Effect.succeed(none)
      : Option.isSome(shared)
        ? Effect.succeed(shared.value)
        : makeFor(enabled)
  )

/** One set for the storage and key-grant layers of a worker (`Awa.layerPg`). */
export const layer = (options: { readonly hotConnections?: boolean | undefined } = {}) =>
  Layer.effect(HotConnections, makeFor(options.hotConnections))
