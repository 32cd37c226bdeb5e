/**
 * Shared fixtures of the Postgres storage tests (properties, prune, ledgers, liveness): retention
 * policies, fresh queue names, job and claim parameters, completing a claimed batch, storage on a
 * pool of its own, and a transaction held open on its own connection.
 */
import { randomUUID } from "node:crypto"
import { TestDatabase } from "@awa/testing"
import { PgClient } from "@effect/sql-pg"
import { Deferred, Effect, Layer, Redacted } from "effect"
import { SqlClient } from "effect/sql"
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

/** Storage on its own pool of `url`, rotating whenever the slot has rows, carrying at once. */
export const eagerStorage = (url: string, maxConnections: number, options: PgQueueStorageOptions = {}) =>
  pgLayer({ rotateMinRows: 1, pruneCarryAfterMs: 0, ...options }).pipe(
    Layer.provideMerge(PgClient.layer({ url: Redacted.make(url), maxConnections }))
  )

/** `body` in a fresh database, with eager storage (3 connections) and its SQL client. */
export const withEagerDatabase = <A, E>(
  options: PgQueueStorageOptions,
  body: (url: string) => Effect.Effect<A, E, QueueStorage | SqlClient.SqlClient>
) =>
  Effect.flatMap(TestDatabase.acquire(), ({ url }) =>
    body(url).pipe(Effect.provide(eagerStorage(url, 3, options)))
  )

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
