/**
 * `Admin`: what an operator reads and does (issue 18, capabilities.md §29), in one service that
 * the `awa` CLI, the Promise facade and an admin API call alike (docs/adr/0024-operator-surface.md).
 * It adds nothing to the storage's semantics: each method is a `QueueStorage`, `CronStorage`,
 * `Migrations` or `Diagnostics` call, with the operator's defaults (a reason for cancels, bulk
 * actions that refuse an empty filter unless `all`).
 *
 * Bulk actions (`drainQueue`, `retryDlqBulk`, `purgeDlqBulk`) run in the storage's batches of
 * 500, each its own transaction: interrupted, they leave the batches done applied and the rest
 * untouched (run again to finish).
 */
import type {
  JobNotFound,
  ReadCommittedRequired,
  UniqueConflict,
  UnsafeBulkFilter,
  ValidationError
} from "@awa/core"
import { Migrations } from "@awa/sql"
import {
  type BulkProgress,
  CronStorage,
  Diagnostics,
  type DlqFilter,
  type DlqRetryOverrides,
  type JobId,
  type ListFilter,
  type QueueHistoryOptions,
  type QueueStatsOptions,
  QueueStorage
} from "@awa/storage"
import { Context, Effect, Layer } from "effect"
import { SqlClient } from "effect/sql"

export interface AdminOptions {
  /** Postgres schema Awa is installed in. Default `"awa"`. */
  readonly schema?: string | undefined
}

const make = Effect.fnUntraced(function* (options: AdminOptions = {}) {
  const storage = yield* QueueStorage
  const cron = yield* CronStorage.CronStorage
  const sql = yield* SqlClient.SqlClient
  const schema = { schema: options.schema }
  const withSql = <A, E>(effect: Effect.Effect<A, E, SqlClient.SqlClient>) =>
    Effect.provideService(effect, SqlClient.SqlClient, sql)
  return {
    queueStats: (options?: QueueStatsOptions) => storage.queueStats(options),
    queueHistory: (options?: QueueHistoryOptions) => storage.queueHistory(options),
    status: withSql(Diagnostics.storageReport(schema)),
    doctor: withSql(Diagnostics.doctor(schema)),
    pendingMigrations: withSql(Migrations.pending(schema)),
    migrate: withSql(Migrations.migrate(schema)),
    pauseQueue: storage.pauseQueue,
    /** Whether inserts skip wake-ups nobody waits for (docs/adr/0038-wake-ups-on-demand.md). */
    wakeOnDemand: storage.wakeOnDemand,
    setWakeOnDemand: storage.setWakeOnDemand,
    resumeQueue: storage.resumeQueue,
    /** Spreads each priority of the queue over `shards` lanes (1–64), capabilities.md §22. */
    setEnqueueShards: (queue: string, shards: number) =>
      storage.configureQueue(queue, { enqueueShards: shards }),
    drainQueue: (queue: string, reason = "drained by operator", progress?: BulkProgress) =>
      storage.drainQueue(queue, reason, progress),
    listJobs: (filter: ListFilter) => storage.listJobs(filter),
    /** The job with its unique key and stored attempts (the job page, `awa jobs show`). */
    getJob: (id: JobId) =>
      Effect.map(Effect.zip(storage.getJob(id), storage.jobDetail(id)), ([job, detail]) => ({
        ...job,
        ...detail
      })),
    retryJob: (id: JobId) => storage.retryJob(id),
    cancelJob: (id: JobId, reason = "cancelled by operator") => storage.cancelJob(id, reason),
    listDlq: (filter: DlqFilter) => storage.listDlq(filter),
    getDlq: (id: JobId) => storage.getDlq(id),
    retryDlq: (id: JobId, overrides?: DlqRetryOverrides) => storage.retryFromDlq(id, overrides),
    retryDlqBulk: (filter: DlqFilter, all = false, progress?: BulkProgress) =>
      storage.retryDlqBulk(filter, { all, ...progress }),
    purgeDlq: (id: JobId) => storage.purgeDlq(id),
    purgeDlqBulk: (filter: DlqFilter, all = false, progress?: BulkProgress) =>
      storage.purgeDlqBulk(filter, { all, ...progress }),
    listCron: cron.list,
    pauseCron: (name: string, by = "operator") => cron.pause(name, by),
    resumeCron: cron.resume,
    triggerCron: cron.trigger
  }
})

export class Admin extends Context.Service<Admin, Effect.Success<ReturnType<typeof make>>>()(
  "@awa/runtime/Admin"
) {}

/** The admin service over the application's `QueueStorage`, `CronStorage` and `SqlClient`. */
export const layer = (options: AdminOptions = {}) => Layer.effect(Admin, make(options))

/** Every error an admin call can fail with (for surfaces that map them to exit codes or statuses). */
export type AdminError =
  | JobNotFound
  | UniqueConflict
  | UnsafeBulkFilter
  | ValidationError
  | ReadCommittedRequired
  | CronStorage.CronNotFound
