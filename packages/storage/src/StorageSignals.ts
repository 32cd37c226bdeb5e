/**
 * Wake-ups and cancellations published by the storage engine, for the worker runtime.
 *
 * Postgres: `LISTEN awa_wake_<schema>` (payload: the queue name; sent on commit of an enqueue,
 * promotion or operator retry) and `LISTEN awa_cancel_<schema>` (payload `<job_id>:<run_lease>`;
 * sent after rescue or operator cancel of a running attempt; also `resumed:…` for callbacks and
 * `key-closed:<policy>` after a worker's finalizations of keyed attempts, `key-gated:<policy>` from
 * a claimer waiting for one). Both LISTENs share one connection of the layer's own (outside the
 * application's pool) while the stream runs; the stream fails with the `SqlError` when that
 * connection is lost, and the runtime re-subscribes.
 *
 * **Waiting for wake-ups** (migration 0051, docs/adr/0038-wake-ups-on-demand.md) An insert sends
 * its queue's wake-up only while some worker waits for one: a dispatcher says so with `waitFor`
 * (a session lock on that same connection, shared per bucket of queues) before it sleeps, and
 * `stopWaiting` while it claims from a backlog. The locks go with the connection: when it is
 * lost, the stream fails and every registration with it.
 *
 * **Gotchas** Notifications are hints, not a log: one sent while nobody listens is lost. Workers
 * therefore also poll, and heartbeat replies report attempts closed elsewhere. Close the stream
 * before the pool: a listener still open when its pool closes made teardown hang
 * (`@effect/sql-pg` 4.0.5).
 */

import { Migrations } from "@awa/sql"
import { PgClient, PgConnection } from "@effect/sql-pg"
import { Context, Deferred, Effect, Exit, Layer, Stream } from "effect"
import type { SqlError } from "effect/sql"
import type { AttemptToken } from "./QueueStorage.ts"

/**
 * What `Waiters.waitFor` found:
 * - `Held`: this process already waits for the queue's wake-ups (it may sleep until one);
 * - `Taken`: it does from now on; an insert committed before may have sent none, so claim once
 *   more before sleeping;
 * - `Busy`: an insert in flight holds the queue's bucket and will send no wake-up: claim again
 *   shortly (after it commits), then ask again;
 * - `Unavailable`: the subscription's connection is gone: inserts may skip the wake-up, so poll
 *   (the stream fails, and the re-subscription wakes every dispatcher).
 */
export type Waiting = "Held" | "Taken" | "Busy" | "Unavailable"

/** A subscription's registrations: which queues' wake-ups its process waits for (migration 0051). */
export interface Waiters {
  /** Waits for wake-ups of `queue` from now on (held until `stopWaiting` or the subscription ends). */
  readonly waitFor: (queue: string) => Effect.Effect<Waiting>
  /** No longer waits for wake-ups of `queue`: inserts into it may skip them. */
  readonly stopWaiting: (queue: string) => Effect.Effect<void>
}

export type Signal =
  | { readonly _tag: "Wake"; readonly queue: string }
  | { readonly _tag: "Cancel"; readonly token: AttemptToken }
  /**
   * A worker closed keyed attempts under this key policy (capabilities.md §23): a grant may be
   * free now, for a claimer of any queue that shares the policy. Only a claimer that may be
   * waiting for one needs it, so it is not a `Wake`: a claimer whose last claim left nothing
   * claimable behind ignores it (ADR 0029, "Closure wake-ups").
   */
  | { readonly _tag: "Closed"; readonly policy: string }
  /**
   * A claimer under this key policy stopped at a key at its limit and waits for a closure (ADR
   * 0037): workers announce their closures of the policy's keyed attempts for a while after this.
   */
  | { readonly _tag: "Gated"; readonly policy: string }
  /** A callback of this attempt was resumed (migration 0034): wake its wait, or take it back if parked. */
  | { readonly _tag: "Resumed"; readonly token: AttemptToken; readonly queue: string }
  /**
   * First element of every (re)subscription, once Postgres has confirmed both LISTENs:
   * notifications sent while nobody listened were lost, so a subscriber should look for work now.
   * `waiters`: where this subscription's process says which queues it waits on (absent: wake-ups
   * need no registration, as in the simulation).
   */
  | { readonly _tag: "Subscribed"; readonly waiters?: Waiters | undefined }

export class StorageSignals extends Context.Service<
  StorageSignals,
  {
    /** Runs until interrupted; fails when the listening connection is lost. */
    readonly signals: Stream.Stream<Signal, SqlError.SqlError>
  }
>()("@awa/storage/StorageSignals") {}

export const wakeChannel = (schema: string) => `awa_wake_${schema}`
export const cancelChannel = (schema: string) => `awa_cancel_${schema}`

/**
 * `key-closed:<policy>` on the cancel channel: a worker's closure notification (PgKeyGrants
 * `notifyClosed`). On the cancel channel because workers older than it ignore what they cannot
 * parse there, where on the wake channel they would claim on every closure. By policy, not by
 * queue: a grant freed in one queue admits the key in every queue of its policy (ADR 0037,
 * amendment). The `closed:<queue>` and `gated:<queue>` of earlier builds are ignored.
 */
export const closedPayload = (policy: string) => `key-closed:${policy}`

/** `key-gated:<policy>` on the cancel channel: a claimer waits for a closure (PgKeyGrants `notifyGated`). */
export const gatedPayload = (policy: string) => `key-gated:${policy}`

/** `resumed:<job>:<lease>:<queue>` on the cancel channel (migration 0034): no third LISTEN. */
const parseResumed = (payload: string): Array<Signal> => {
  const m = /^resumed:(\d+):(\d+):(.*)$/s.exec(payload)
  if (m === null) return []
  return [{ _tag: "Resumed", token: { jobId: BigInt(m[1]!), runLease: BigInt(m[2]!) }, queue: m[3]! }]
}

const parseCancel = (payload: string): Array<Signal> => {
  const [jobId, runLease] = payload.split(":")
  if (jobId === undefined || runLease === undefined || !/^\d+$/.test(jobId) || !/^\d+$/.test(runLease))
    return []
  return [{ _tag: "Cancel", token: { jobId: BigInt(jobId), runLease: BigInt(runLease) } }]
}

/**
 * LISTEN on both channels of `schema`, on one connection of the layer's own per subscription (the
 * application's `PgClient` settings), which also holds that subscription's waiters' locks
 * (migration 0051).
 */
export const layerPg = (options: { readonly schema?: string | undefined } = {}) =>
  Layer.effect(
    StorageSignals,
    Effect.gen(function* () {
      const client = yield* PgClient.PgClient
      const schema = yield* Migrations.checkSchemaName(options.schema ?? Migrations.defaultSchema)
      const config: PgConnection.Config = {
        ...client.config,
        applicationName: `${client.config.applicationName ?? "awa"} signals`
      }
      const bucketKey = `${schema}.lock_ns('waiters'), ${schema}.waiter_bucket($1)`
      const signals = Stream.unwrap(
        Effect.gen(function* () {
          const connection = yield* PgConnection.make(config)
          // pinned: the LISTENs and the lock calls share the session (and so its locks)
          const session = yield* connection.pin
          // listen returns once Postgres confirmed the LISTEN; the queues live as long as the stream
          const wakeQueue = yield* session.listen(wakeChannel(schema))
          const cancelQueue = yield* session.listen(cancelChannel(schema))
          const lost = yield* Deferred.make<never, SqlError.SqlError>()
          const waiting = new Set<string>()
          let open = true
          // first when the stream ends: no registration is answered after its connection
          yield* Effect.addFinalizer(() => Effect.sync(() => (open = false)))
          const failed = (error: SqlError.SqlError) =>
            Effect.sync(() => {
              open = false
              Deferred.doneUnsafe(lost, Exit.fail(error))
            })
          const waiters: Waiters = {
            waitFor: (queue) =>
              Effect.suspend((): Effect.Effect<Waiting> => {
                if (!open) return Effect.succeed("Unavailable")
                if (waiting.has(queue)) return Effect.succeed("Held")
                return session
                  .query(`SELECT pg_try_advisory_lock_shared(${bucketKey}) AS taken`, [queue])
                  .pipe(
                    Effect.map((result): Waiting => {
                      if (result.rows[0]?.taken !== true) return "Busy"
                      waiting.add(queue)
                      return "Taken"
                    }),
                    Effect.catch((error) => Effect.as(failed(error), "Unavailable" as const)),
                    // a lock taken is noted before anything can interrupt (a lost note would leak it)
                    Effect.uninterruptible
                  )
              }),
            stopWaiting: (queue) =>
              Effect.suspend(() => {
                if (!open || !waiting.delete(queue)) return Effect.void
                return session
                  .query(`SELECT pg_advisory_unlock_shared(${bucketKey})`, [queue])
                  .pipe(Effect.asVoid, Effect.catch(failed), Effect.uninterruptible)
              })
          }
          const wakes = Stream.map(
            Stream.fromQueue(wakeQueue),
            (n): Signal => ({ _tag: "Wake", queue: n.payload })
          )
          const cancels = Stream.flatMap(Stream.fromQueue(cancelQueue), (n) =>
            Stream.fromIterable(
              n.payload.startsWith("resumed:")
                ? parseResumed(n.payload)
                : n.payload.startsWith("key-closed:")
                  ? [{ _tag: "Closed", policy: n.payload.slice("key-closed:".length) } satisfies Signal]
                  : n.payload.startsWith("key-gated:")
                    ? [{ _tag: "Gated", policy: n.payload.slice("key-gated:".length) } satisfies Signal]
                    : parseCancel(n.payload)
            )
          )
          return Stream.concat(
            Stream.succeed<Signal>({ _tag: "Subscribed", waiters }),
            Stream.merge(Stream.merge(wakes, cancels), Stream.fromEffectDrain(Deferred.await(lost)))
          )
        })
      )
      return StorageSignals.of({ signals })
    })
  )

/** No notifications: workers rely on polling and heartbeat replies (the simulation layer). */
export const layerSilent: Layer.Layer<StorageSignals> = Layer.succeed(
  StorageSignals,
  StorageSignals.of({ signals: Stream.never })
)
