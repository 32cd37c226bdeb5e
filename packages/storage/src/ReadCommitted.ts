/**
 * Running storage calls at READ COMMITTED whatever the pool's `default_transaction_isolation`
 * (migration 0027, docs/adr/0021-server-defaults.md decision 5).
 *
 * **Guarantee** A call made outside a transaction runs at READ COMMITTED: first as a plain
 * statement (the pool's default, READ COMMITTED on a stock server: no extra round trip); if the
 * SQL function refuses (SQLSTATE AWI01, its first statement, so nothing was done), again inside
 * `BEGIN ISOLATION LEVEL READ COMMITTED … COMMIT`, and every later call of this wrapper goes that
 * way at once. A call made inside the caller's transaction cannot change its level: a refusal
 * there is the typed `ReadCommittedRequired`.
 *
 * **Gotchas** On a pool whose sessions default to REPEATABLE READ or SERIALIZABLE every call
 * costs two more round trips (BEGIN, COMMIT). A pool of our own (the heartbeat thread's) starts
 * its sessions at READ COMMITTED instead (`readCommittedStartup`); a pool shared with the
 * application keeps the application's default, which we must not change under it.
 */
import { ReadCommittedRequired } from "@awa/core"
import { Effect, Option } from "effect"
import { SqlClient, SqlError } from "effect/sql"

/** SQLSTATE the SQL functions raise outside READ COMMITTED. */
export const refusalCode = "AWI01"

/** Startup parameters that make a pool of our own start every session at READ COMMITTED. */
export const readCommittedStartup = { default_transaction_isolation: "read committed" } as const

const pgError = (error: SqlError.SqlError): Record<string, unknown> | undefined =>
  (error.reason as { cause?: Record<string, unknown> }).cause

const isRefusal = (error: unknown): error is SqlError.SqlError =>
  SqlError.isSqlError(error) && pgError(error)?.code === refusalCode

// The function's message ends with the level it saw: "claim needs READ COMMITTED, not SERIALIZABLE".
const toTyped = (operation: string, error: SqlError.SqlError) => {
  const message = pgError(error)?.message
  const isolation = typeof message === "string" ? /not ([A-Z ]+)$/.exec(message)?.[1] : undefined
  return new ReadCommittedRequired({ operation, isolation: isolation ?? "non-READ COMMITTED" })
}

/** A refusal (AWI01) as the typed error; other errors pass through. */
export const mapRefusal =
  (operation: string) =>
  <A, E, R>(effect: Effect.Effect<A, E, R>): Effect.Effect<A, E | ReadCommittedRequired, R> =>
    Effect.catchIf(
      effect,
      (error): error is E & SqlError.SqlError => isRefusal(error),
      (error) => Effect.fail(toTyped(operation, error))
    )

/** The wrapper for one client; it remembers (per storage layer) that the pool needs forcing. */
export const make = (sql: SqlClient.SqlClient) => {
  let force = false
  const inOwnTransaction = <A, E, R>(call: Effect.Effect<A, E, R>) =>
    sql
      .withTransaction(call)
      .pipe(Effect.provideService(SqlClient.BeginTransaction, "BEGIN ISOLATION LEVEL READ COMMITTED"))
  return <A, E, R>(
    operation: string,
    call: Effect.Effect<A, E, R>
  ): Effect.Effect<A, E | SqlError.SqlError | ReadCommittedRequired, R> =>
    Effect.gen(function* () {
      if (Option.isSome(yield* Effect.serviceOption(sql.transactionService))) return yield* call
      if (force) return yield* inOwnTransaction(call)
      return yield* Effect.catchIf(
        call,
        (error): error is E & SqlError.SqlError => isRefusal(error),
        () => {
          force = true
          return inOwnTransaction(call)
        }
      )
    }).pipe(mapRefusal(operation))
}
