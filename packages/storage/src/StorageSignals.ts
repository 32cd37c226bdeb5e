/**
 * Wake-ups and cancellations published by the storage engine, for the worker runtime.
 *
 * Postgres: `LISTEN awa_wake_<schema>` (payload: the queue name; sent on commit of an enqueue,
 * promotion or operator retry) and `LISTEN awa_cancel_<schema>` (payload `<job_id>:<run_lease>`;
 * sent after rescue or operator cancel of a running attempt; also `resumed:…` for callbacks and
 * `key-closed:<policy>` after a worker's finalizations of keyed attempts, `key-gated:<policy>` from
 * a claimer waiting for one). Each listener holds one pooled connection while the stream runs;
 * the stream fails with the `SqlError` when that connection is lost, and the runtime
 * re-subscribes.
 *
 * **Gotchas** Notifications are hints, not a log: one sent while nobody listens is lost. Workers
 * therefore also poll, and heartbeat replies report attempts closed elsewhere. Close the stream
 * before the pool: a listener still open when its pool closes made teardown hang
 * (`@effect/sql-pg` 4.0.5).
 */

import { Migrations } from "@awa/sql"
import { PgClient } from "@effect/sql-pg"
import { Context, Effect, Layer, Stream } from "effect"
import type { SqlError } from "effect/sql"
import type { AttemptToken } from "./QueueStorage.ts"

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
   * notifications sent while nobody listened are lost, so a subscriber should look for work now.
   */
  | { readonly _tag: "Subscribed" }

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

/** LISTEN on both channels of `schema` (each LISTEN holds a pooled connection). */
export const layerPg = (options: { readonly schema?: string | undefined } = {}) =>
  Layer.effect(
    StorageSignals,
    Effect.gen(function* () {
      const sql = yield* PgClient.PgClient
      const schema = yield* Migrations.checkSchemaName(options.schema ?? Migrations.defaultSchema)
      const signals = Stream.unwrap(
        Effect.gen(function* () {
          // sql.listen returns once Postgres confirmed the LISTEN; the queues live as long as the stream
          const wakeQueue = yield* sql.listen(wakeChannel(schema))
          const cancelQueue = yield* sql.listen(cancelChannel(schema))
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
          return Stream.concat(Stream.succeed<Signal>({ _tag: "Subscribed" }), Stream.merge(wakes, cancels))
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
