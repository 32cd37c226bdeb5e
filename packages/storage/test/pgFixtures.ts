/**
 * Shared fixtures of the Postgres storage tests (properties, prune, ledgers, liveness): retention
 * policies, fresh queue names, job and claim parameters, completing a claimed batch, the two
 * claims side by side, storage (and key grants) on a pool of its own, and a transaction held open
 * on its own connection.
 */
import { randomUUID } from "node:crypto"
import { TestDatabase } from "@awa/testing"
import { PgClient } from "@effect/sql-pg"
import { Deferred, Effect, Layer, Redacted, Schedule, type Scope } from "effect"
import { SqlClient } from "effect/sql"
import { KeyGrants } from "../src/KeyGrants.ts"
import { layer as pgGrants } from "../src/PgKeyGrants.ts"
import { type PgQueueStorageOptions, layer as pgLayer } from "../src/PgQueueStorage.ts"
import { type ClaimedJob, QueueStorage, type RetentionParams } from "../src/QueueStorage.ts"

export const day = 86_400_000
export const keepAll: RetentionParams = { completedMs: day, failedMs: 3 * day, cancelledMs: 3 * day }
export const keepNothing: RetentionParams = { completedMs: 0, failedMs: 0, cancelledMs: 0 }

/** A queue name no other test uses. */
export const fresh = (label: string) => `${label}-${randomUUID().slice(0, 8)}`

/** Claim parameters with no deadline and no aging. */
export const claimOf = (queue: string, max: number) => ({ queue, max, deadlineMs: 0, agingIntervalMs: 0 })

/** Completes every attempt of a claimed batch. */
export const completeAll = (claimed: ReadonlyArray<ClaimedJob>) =>
  Effect.flatMap(QueueStorage, (s) =>
    s.finalizeMany(
      claimed.map((c) => ({ jobId: c.jobId, runLease: c.runLease, outcome: { _tag: "Complete" as const } }))
    )
  )

/**
 * The two claims that read a lane, by migration name: `claim`, and `claim_keyed` under `policy`
 * (for what both share, a policy no key of the test reaches). A gated keyed claim returns no jobs.
 */
export const claimers: Record<
  "claim" | "claim_keyed",
  (
    queue: string,
    policy: string,
    max: number
  ) => Effect.Effect<ReadonlyArray<ClaimedJob>, unknown, QueueStorage | KeyGrants>
> = {
  claim: (queue, _policy, max) => Effect.flatMap(QueueStorage, (s) => s.claim(claimOf(queue, max))),
  claim_keyed: (queue, policy, max) =>
    Effect.flatMap(KeyGrants, (grants) =>
      Effect.map(grants.claim({ queue, policy, max, deadlineMs: 0, agingIntervalMs: 0 }), (out) =>
        out._tag === "Claimed" ? out.jobs : []
      )
    )
}

/** Storage on its own pool of `url`, rotating whenever the slot has rows, carrying at once. */
export const eagerStorage = (url: string, maxConnections: number, options: PgQueueStorageOptions = {}) =>
  pgLayer({ rotateMinRows: 1, pruneCarryAfterMs: 0, ...options }).pipe(
    Layer.provideMerge(PgClient.layer({ url: Redacted.make(url), maxConnections }))
  )

/** Eager storage and the key-grant layer on it, on a pool of `maxConnections`. */
export const eagerGrants = (url: string, maxConnections: number) =>
  pgGrants().pipe(Layer.provideMerge(eagerStorage(url, maxConnections)))

/** `body` in a fresh database, with eager storage on a pool of `maxConnections` and its clients. */
export const withStorageDatabase = <A, E>(
  body: (
    url: string
  ) => Effect.Effect<A, E, QueueStorage | PgClient.PgClient | SqlClient.SqlClient | Scope.Scope>,
  maxConnections = 4,
  options: PgQueueStorageOptions = {}
) =>
  Effect.flatMap(TestDatabase.acquire(), ({ url }) =>
    body(url).pipe(Effect.provide(eagerStorage(url, maxConnections, options)))
  )

/** `body` in a fresh database, with eager storage (3 connections) and its SQL client. */
export const withEagerDatabase = <A, E>(
  options: PgQueueStorageOptions,
  body: (url: string) => Effect.Effect<A, E, QueueStorage | SqlClient.SqlClient>
) => withStorageDatabase(body, 3, options)

/** `body` in a fresh database, with eager storage and key grants on a pool of 2 and its SQL client. */
export const withGrantsDatabase = <A, E>(
  body: Effect.Effect<A, E, QueueStorage | KeyGrants | SqlClient.SqlClient>
) => Effect.flatMap(TestDatabase.acquire(), ({ url }) => body.pipe(Effect.provide(eagerGrants(url, 2))))

/**
 * Runs `statement` in a transaction on its own connection and keeps it open until `release`
 * completes; returns once the statement has run (its locks are held from then on).
 */
export const holdOpenUntil = (url: string, statement: string, release: Deferred.Deferred<void>) =>
  Effect.gen(function* () {
    const started = yield* Deferred.make<void>()
    const fiber = yield* Effect.gen(function* () {
      const c = yield* SqlClient.SqlClient
      yield* c.withTransaction(
        Effect.andThen(
          c.unsafe(statement),
          Effect.andThen(Deferred.succeed(started, undefined), Deferred.await(release))
        )
      )
    }).pipe(
      Effect.provide(eagerStorage(url, 1), { local: true }),
      Effect.forkChild({ startImmediately: true })
    )
    yield* Deferred.await(started)
    return fiber
  })

/**
 * Leaves autovacuum nothing to do in the database at `url`, so that no vacuum or analyze of its
 * own invalidates the statements a test's sessions cache while it measures them (an invalidated
 * plan is planned again inside the measured transaction, and planning locks every ring child and
 * index). A backend reports the table statistics it has not reported yet when it exits, so a
 * connection that wrote thousands of rows and closed after a VACUUM ANALYZE would hand autovacuum
 * those changes to analyze: this waits until every other client backend of the database has
 * exited, then runs VACUUM ANALYZE, and ANALYZE again until the statistics show nothing left to
 * analyze. (PostgreSQL 14's statistics collector can take an exited backend's last report after
 * that VACUUM ANALYZE: seen once in the CI matrix, 20,501 rows left to analyze.)
 */
export const settleStatistics = (url: string) =>
  Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    const others = sql<{ n: number }>`
      SELECT count(*)::int AS n FROM pg_stat_activity
      WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'`
    yield* others.pipe(
      Effect.flatMap(([row]) =>
        row!.n === 0 ? Effect.void : Effect.fail(`${row!.n} other client backends still connected`)
      ),
      Effect.retry(Schedule.spaced("20 millis").pipe(Schedule.upTo({ times: 1_000 }))),
      Effect.orDie
    )
    yield* sql`VACUUM ANALYZE`
    yield* unanalyzedChanges(url).pipe(
      Effect.flatMap((n) => (n === 0 ? Effect.void : Effect.andThen(sql`ANALYZE`, Effect.fail(n)))),
      Effect.retry(Schedule.spaced("20 millis").pipe(Schedule.upTo({ times: 100 }))),
      Effect.orDie
    )
  }).pipe(Effect.provide(PgClient.layer({ url: Redacted.make(url), maxConnections: 1 })))

/**
 * Rows of the database at `url` written since their table was last analyzed, as the server's
 * statistics have them (0 after `settleStatistics`, until someone commits a write).
 */
export const unanalyzedChanges = (url: string) =>
  Effect.gen(function* () {
    const [row] = yield* (yield* SqlClient.SqlClient)<{ n: number }>`
      SELECT coalesce(sum(n_mod_since_analyze), 0)::int AS n FROM pg_stat_user_tables WHERE schemaname = 'awa'`
    return row!.n
  }).pipe(Effect.provide(PgClient.layer({ url: Redacted.make(url), maxConnections: 1 })))

/**
 * The tables of the database at `url` that autovacuum would analyze now: more rows changed since
 * their last analyze than `autovacuum_analyze_threshold + autovacuum_analyze_scale_factor ×
 * reltuples` (partitioned parents excepted: autovacuum never analyzes them). Each as
 * "table: changes > threshold"; empty when autovacuum has no reason to invalidate anyone's plans.
 * Unlike `unanalyzedChanges`, it does not turn on when sessions flush their statistics: writes
 * below the threshold (at least 50 rows per table by default) are not due, whenever they show.
 */
export const dueForAnalyze = (url: string) =>
  Effect.gen(function* () {
    const rows = yield* (yield* SqlClient.SqlClient)<{ name: string; changes: number; threshold: number }>`
      SELECT s.relname AS name, s.n_mod_since_analyze::int AS changes,
             (current_setting('autovacuum_analyze_threshold')::float8
              + current_setting('autovacuum_analyze_scale_factor')::float8 * greatest(c.reltuples, 0))::int
               AS threshold
      FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid
      WHERE s.schemaname = 'awa' AND c.relkind = 'r'`
    return rows.filter((r) => r.changes > r.threshold).map((r) => `${r.name}: ${r.changes} > ${r.threshold}`)
  }).pipe(Effect.provide(PgClient.layer({ url: Redacted.make(url), maxConnections: 1 })))

/** True while some session waits for an advisory lock (a lane's claim or enqueue lock). */
export const someoneWaits = Effect.flatMap(
  SqlClient.SqlClient,
  (sql) =>
    sql<{ n: number }>`SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'advisory' AND NOT granted`
).pipe(Effect.map(([row]) => row!.n > 0))
