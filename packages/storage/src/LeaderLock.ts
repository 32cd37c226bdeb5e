/**
 * The maintenance leader's lock (capability 8).
 *
 * Postgres: a *session* advisory lock held on a dedicated connection reserved from the pool
 * (never a pooled query, which could run on another connection). Postgres releases it when that
 * connection dies, so a crashed leader hands over within the other workers' election interval.
 * The lock is released explicitly before the connection goes back to the pool (otherwise it
 * would survive the reservation).
 */

import { Migrations } from "@awa/sql"
import { Context, Effect, Layer, Option, Ref, type Scope } from "effect"
import { SqlClient, type SqlError } from "effect/sql"

export interface Leadership {
  /** Succeeds while the lock is still held; fails when its connection was lost. */
  readonly check: Effect.Effect<void, SqlError.SqlError>
}

export class LeaderLock extends Context.Service<
  LeaderLock,
  {
    /** Tries to take leadership for the enclosing scope; `None` when another process holds it. */
    readonly tryAcquire: Effect.Effect<Option.Option<Leadership>, SqlError.SqlError, Scope.Scope>
  }
>()("@awa/storage/LeaderLock") {}

// Persistent advisory-lock wire format: every Awa version must derive this key the same way.
const leaderKey = (schema: string) => `awa:leader:${schema}`

export const layerPg = (options: { readonly schema?: string | undefined } = {}) =>
  Layer.effect(
    LeaderLock,
    Effect.gen(function* () {
      const sql = yield* SqlClient.SqlClient
      const schema = yield* Migrations.checkSchemaName(options.schema ?? Migrations.defaultSchema)
      const key = leaderKey(schema)
      const tryAcquire = Effect.gen(function* () {
        const conn = yield* sql.reserve
        const [row] = (yield* conn.execute(
          "SELECT pg_try_advisory_lock(hashtextextended($1, 0)) AS ok",
          [key],
          undefined
        )) as ReadonlyArray<{ ok: boolean }>
        if (!row?.ok) return Option.none<Leadership>()
        yield* Effect.addFinalizer(() =>
          conn
            .execute("SELECT pg_advisory_unlock(hashtextextended($1, 0))", [key], undefined)
            .pipe(Effect.ignore)
        )
        return Option.some<Leadership>({ check: Effect.asVoid(conn.execute("SELECT 1", [], undefined)) })
      })
      return LeaderLock.of({ tryAcquire })
    })
  )

/** An in-process lock shared by every worker built on the same layer instance (simulation). */
export const layerMemory: Layer.Layer<LeaderLock> = Layer.effect(
  LeaderLock,
  Effect.gen(function* () {
    const held = yield* Ref.make(false)
    const tryAcquire = Effect.gen(function* () {
      const won = yield* Ref.modify(held, (h) => [!h, true] as const)
      if (!won) return Option.none<Leadership>()
      yield* Effect.addFinalizer(() => Ref.set(held, false))
      return Option.some<Leadership>({ check: Effect.void })
    })
    return LeaderLock.of({ tryAcquire })
  })
)
