/**
 * Composition root: the layers an application provides.
 *
 * ```ts
 * const AwaLive = Awa.layerPg({ migrateOnStart: true })          // needs the app's PgClient layer
 * const WorkerLive = Awa.worker({ queues: { default: {} }, handlers: [sendEmail] })
 * Layer.launch(WorkerLive.pipe(Layer.provideMerge(AwaLive), Layer.provide(PgLive)))
 * ```
 *
 * `layerSim` swaps Postgres for the deterministic in-memory engine (drive time with `TestClock`).
 */
import { Migrations } from "@awa/sql"
import {
  CronStorage,
  FlowStorage,
  Heartbeats,
  HotConnections,
  LeaderLock,
  PgCallbackStorage,
  PgKeyGrants,
  PgQueueStorage,
  SimKeyGrants,
  SimQueueStorage,
  StorageSignals
} from "@awa/storage"
import { PgClient } from "@effect/sql-pg"
import { Effect, Layer } from "effect"
import { type SqlClient, SqlError } from "effect/sql"
import * as AwaClient from "./AwaClient.ts"
import * as Callbacks from "./Callbacks.ts"
import * as HttpWorker from "./HttpWorker.ts"
import * as Worker from "./Worker.ts"

export interface AwaPgOptions extends PgQueueStorage.PgQueueStorageOptions, AwaClient.AwaClientOptions {
  /** Apply pending migrations at start instead of failing with `SchemaNotMigrated`. Default false. */
  readonly migrateOnStart?: boolean | undefined
}

/**
 * Storage, key grants, cron storage, signals, leader lock, heartbeats (from a thread with its own
 * connection) and client on Postgres, behind the schema-version fence.
 */
export const layerPg = (options: AwaPgOptions = {}) => {
  const fence = Layer.effectDiscard(
    Migrations.ensureCompatible({ schema: options.schema, migrateOnStart: options.migrateOnStart }).pipe(
      // the fence is the first query: a pool that connects lazily fails here
      Effect.mapError((error) => (SqlError.isSqlError(error) ? explainSqlError(error) : error))
    )
  )
  const engine = Layer.mergeAll(
    PgQueueStorage.layer(options),
    PgCallbackStorage.layer(options),
    StorageSignals.layerPg(options),
    LeaderLock.layerPg(options),
    CronStorage.layerPg(options),
    PgKeyGrants.layer(options),
    FlowStorage.layerPg(options)
  ).pipe(
    // one set of hot-path connections for storage and key grants (ADR 0033)
    Layer.provide(HotConnections.layer(options)),
    Layer.provide(fence)
  )
  return Layer.merge(AwaClient.layer(options), Callbacks.layer).pipe(
    Layer.provideMerge(Heartbeats.layerThread(options).pipe(Layer.provideMerge(engine)))
  )
}

/** The same services in memory: deterministic under `TestClock`, no Postgres. */
export const layerSim = (options: AwaClient.AwaClientOptions = {}) =>
  Layer.merge(AwaClient.layer(options), Callbacks.layer).pipe(
    Layer.provideMerge(
      // cron enqueues into the same in-memory queue
      Layer.mergeAll(
        CronStorage.layerSim,
        FlowStorage.layerSim,
        StorageSignals.layerSilent,
        LeaderLock.layerMemory,
        SimKeyGrants.layer
      ).pipe(Layer.provideMerge(SimQueueStorage.layer))
    )
  )

export const worker = Worker.layer

/** A handler that runs `kind` by calling an HTTP function (capabilities.md §18; HttpWorker.ts). */
export const httpWorker = HttpWorker.make

/**
 * Applies pending migrations once (what `migrateOnStart` does at start). Needs a `SqlClient`,
 * e.g. `Effect.runPromise(Awa.migrate().pipe(Effect.provide(Awa.pgClient({ url }))))`.
 */
export const migrate = (options: Migrations.SchemaOptions = {}) => Migrations.migrate(options)

/** The innermost message of an error's `cause` chain: what actually went wrong. */
const rootMessage = (error: unknown): string | undefined => {
  let found: string | undefined
  let current: unknown = error
  for (let depth = 0; depth < 8 && typeof current === "object" && current !== null; depth++) {
    const message = (current as { readonly message?: unknown }).message
    if (typeof message === "string" && message !== "") found = message
    current = (current as { readonly cause?: unknown }).cause
  }
  return found
}

/**
 * A driver error whose first line names the real cause. `@effect/sql-pg` reports "PgConnection:
 * Failed to connect" with `connect ECONNREFUSED …` or `database "x" does not exist` three
 * `cause` levels down, where a log line never shows it; this copies it up into the message.
 */
export const explainSqlError = (error: SqlError.SqlError): SqlError.SqlError => {
  const reason = error.reason
  const root = rootMessage(reason.cause)
  if (root === undefined || error.message.includes(root)) return error
  const Reason = reason.constructor as new (fields: {
    readonly cause: unknown
    readonly message: string
    readonly operation?: string | undefined
  }) => SqlError.SqlError["reason"]
  return new SqlError.SqlError({
    reason: new Reason({
      cause: reason.cause,
      message: `${error.message}: ${root}`,
      ...(reason.operation === undefined ? {} : { operation: reason.operation })
    })
  })
}

/**
 * `PgClient.layer` whose connection errors name their cause on the first line (a wrong port,
 * host, password or database name), for `Awa.layerPg` and `Awa.migrate`.
 */
export const pgClient = (
  config: PgClient.PgPoolConfig
): Layer.Layer<PgClient.PgClient | SqlClient.SqlClient, SqlError.SqlError> =>
  Layer.effectContext(Effect.mapError(Layer.build(PgClient.layer(config)), explainSqlError))
