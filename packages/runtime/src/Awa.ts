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
  Heartbeats,
  LeaderLock,
  PgQueueStorage,
  SimQueueStorage,
  StorageSignals
} from "@awa/storage"
import { Layer } from "effect"
import * as AwaClient from "./AwaClient.ts"
import * as Worker from "./Worker.ts"

export interface AwaPgOptions extends PgQueueStorage.PgQueueStorageOptions, AwaClient.AwaClientOptions {
  /** Apply pending migrations at start instead of failing with `SchemaNotMigrated`. Default false. */
  readonly migrateOnStart?: boolean | undefined
}

/**
 * Storage, cron storage, signals, leader lock, heartbeats (from a thread with its own connection)
 * and client on Postgres, behind the schema-version fence.
 */
export const layerPg = (options: AwaPgOptions = {}) => {
  const fence = Layer.effectDiscard(
    Migrations.ensureCompatible({ schema: options.schema, migrateOnStart: options.migrateOnStart })
  )
  const engine = Layer.mergeAll(
    PgQueueStorage.layer(options),
    StorageSignals.layerPg(options),
    LeaderLock.layerPg(options),
    CronStorage.layerPg(options)
  ).pipe(Layer.provide(fence))
  return AwaClient.layer(options).pipe(
    Layer.provideMerge(Heartbeats.layerThread(options).pipe(Layer.provideMerge(engine)))
  )
}

/** The same services in memory: deterministic under `TestClock`, no Postgres. */
export const layerSim = (options: AwaClient.AwaClientOptions = {}) =>
  AwaClient.layer(options).pipe(
    Layer.provideMerge(
      // cron enqueues into the same in-memory queue
      Layer.mergeAll(CronStorage.layerSim, StorageSignals.layerSilent, LeaderLock.layerMemory).pipe(
        Layer.provideMerge(SimQueueStorage.layer)
      )
    )
  )

export const worker = Worker.layer

/** Runs `migrate` once (the `awa migrate` command does the same). */
export const migrate = (options: Migrations.SchemaOptions = {}) => Migrations.migrate(options)
