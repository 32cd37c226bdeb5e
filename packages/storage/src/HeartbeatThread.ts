/**
 * Entry point of the heartbeat thread (`Heartbeats.layerThread`): a `worker_threads` thread with
 * its own connection that heartbeats the attempts the main thread tells it about, on its own
 * timer, so a handler blocking the main event loop cannot stop them (capabilities.md §6).
 *
 * **Protocol** (structured-clone messages; bigints survive the clone)
 * - main → thread: `track` [jobId, runLease, heldAt][]; `untrack` keys; `progress`
 *   [key, progress, generation][]; `flush` {id, jobId, runLease, progress, generation}; `stop`.
 * - thread → main: `ready` (connected), `failed` {message} (could not start), `closed`
 *   [jobId, runLease][] (attempts a heartbeat found closed), `flushed` {id, error?}, `warn`
 *   {message}.
 * - Liveness: the main thread stores `Date.now()` in `tick` (a shared `BigInt64Array`) every
 *   `tickMs`. Once that is older than `maxStallMs` the main loop is presumed stuck for good and
 *   the thread stops heartbeating, so the process's attempts are rescued as if it had died.
 *
 * This module is a program, not a library: it runs its own Effect with `Effect.runFork`. It is
 * loaded by path (see `Heartbeats.threadEntry`), so it imports only what the thread needs.
 */
import { parentPort, workerData } from "node:worker_threads"
import { PgClient } from "@effect/sql-pg"
import { Cause, Deferred, Effect, Layer, Queue, Redacted } from "effect"
import { SqlClient } from "effect/sql"
import * as HeartbeatCore from "./HeartbeatCore.ts"
import * as PgQueueStorage from "./PgQueueStorage.ts"
import { QueueStorage } from "./QueueStorage.ts"
import * as ReadCommitted from "./ReadCommitted.ts"

/** What the main thread hands over at spawn (all structured-cloneable). */
export interface ThreadData {
  readonly connection: ThreadConnection
  readonly schema: string
  readonly intervalMs: number
  readonly maxStallMs: number
  readonly tick: SharedArrayBuffer
}

/** The subset of `PgClientConfig` a thread can receive: plain values, secrets unwrapped. */
export interface ThreadConnection {
  readonly url?: string | undefined
  readonly host?: string | undefined
  readonly port?: number | undefined
  readonly path?: string | undefined
  readonly ssl?: boolean | object | undefined
  readonly database?: string | undefined
  readonly username?: string | undefined
  readonly password?: string | undefined
  readonly connectTimeoutMs?: number | undefined
  readonly keepAliveMs?: number | undefined
  readonly applicationName: string
  readonly startupParameters?: Readonly<Record<string, string>> | undefined
  readonly startupOptions?: string | undefined
}

export type ToThread =
  | { readonly t: "track"; readonly a: ReadonlyArray<readonly [bigint, bigint, number]> }
  | { readonly t: "untrack"; readonly k: ReadonlyArray<string> }
  | {
      readonly t: "progress"
      readonly p: ReadonlyArray<readonly [string, Readonly<Record<string, unknown>>, number]>
    }
  | {
      readonly t: "flush"
      readonly id: number
      readonly jobId: bigint
      readonly runLease: bigint
      readonly progress: Readonly<Record<string, unknown>>
      readonly generation: number
    }
  | { readonly t: "stop" }

export type FromThread =
  | { readonly t: "ready" }
  | { readonly t: "failed"; readonly message: string }
  | { readonly t: "closed"; readonly tokens: ReadonlyArray<readonly [bigint, bigint]> }
  | { readonly t: "flushed"; readonly id: number; readonly error?: string | undefined }
  | { readonly t: "warn"; readonly message: string }

const clientLayer = (c: ThreadConnection) =>
  PgClient.layer({
    ...(c.url === undefined ? {} : { url: Redacted.make(c.url) }),
    ...(c.host === undefined ? {} : { host: c.host }),
    ...(c.port === undefined ? {} : { port: c.port }),
    ...(c.path === undefined ? {} : { path: c.path }),
    ...(c.ssl === undefined ? {} : { ssl: c.ssl as boolean }),
    ...(c.database === undefined ? {} : { database: c.database }),
    ...(c.username === undefined ? {} : { username: c.username }),
    ...(c.password === undefined ? {} : { password: Redacted.make(c.password) }),
    ...(c.connectTimeoutMs === undefined ? {} : { connectTimeout: c.connectTimeoutMs }),
    ...(c.keepAliveMs === undefined ? {} : { keepAlive: c.keepAliveMs }),
    // our own connection: it starts at READ COMMITTED whatever the database's default, so its
    // heartbeats need no retry in a transaction of their own (ReadCommitted.ts, migration 0027)
    startupParameters: { ...c.startupParameters, ...ReadCommitted.readCommittedStartup },
    ...(c.startupOptions === undefined ? {} : { startupOptions: c.startupOptions }),
    applicationName: c.applicationName,
    maxConnections: 1
  })

const firstLine = (cause: Cause.Cause<unknown>) => Cause.pretty(cause).split("\n")[0] ?? "unknown error"

const run = (port: NonNullable<typeof parentPort>, data: ThreadData) => {
  const send = (message: FromThread) => port.postMessage(message)
  const tick = new BigInt64Array(data.tick)
  const program = Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    yield* sql`SELECT 1` // connected, or the thread reports why not
    const core = HeartbeatCore.make(yield* QueueStorage, data.intervalMs)
    const flushes = yield* Queue.unbounded<Extract<ToThread, { t: "flush" }>>()
    const stop = yield* Deferred.make<void>()
    // Track, untrack and progress change plain state at once; flushes need the connection.
    port.on("message", (message: ToThread) => {
      switch (message.t) {
        case "track":
          core.track(message.a.map(([jobId, runLease, heldAt]) => ({ jobId, runLease, heldAt })))
          return
        case "untrack":
          for (const key of message.k) core.untrack(key)
          return
        case "progress":
          for (const [key, progress, generation] of message.p) core.setProgress(key, progress, generation)
          return
        case "flush":
          Queue.offerUnsafe(flushes, message)
          return
        case "stop":
          Deferred.doneUnsafe(stop, Effect.void)
          return
      }
    })
    yield* Queue.take(flushes).pipe(
      Effect.flatMap((f) =>
        core.flush({ jobId: f.jobId, runLease: f.runLease }, f.progress, f.generation).pipe(
          Effect.matchCause({
            onSuccess: () => send({ t: "flushed", id: f.id }),
            onFailure: (cause) => send({ t: "flushed", id: f.id, error: firstLine(cause) })
          }),
          Effect.forkChild
        )
      ),
      Effect.forever,
      Effect.forkChild
    )
    let stalled = false
    const round = Effect.gen(function* () {
      const silentMs = Date.now() - Number(Atomics.load(tick, 0))
      if (silentMs > data.maxStallMs) {
        if (!stalled)
          send({
            t: "warn",
            message: `event loop stalled for ${silentMs} ms (more than watchdog.maxStall): heartbeats stopped, so this process's attempts will be rescued`
          })
        stalled = true
        return
      }
      stalled = false
      // a lost connection (terminated backend, restart) is replaced on the first retry: the
      // heartbeat that failed lands as soon as it is back, not a whole interval later
      const closed = yield* core.beat.pipe(Effect.retry(HeartbeatCore.retryRound(data.intervalMs)))
      if (closed.length > 0) send({ t: "closed", tokens: closed.map((c) => [c.jobId, c.runLease] as const) })
    })
    yield* round.pipe(
      Effect.catchCause((cause) =>
        Effect.sync(() => send({ t: "warn", message: `heartbeat failed: ${firstLine(cause)}` }))
      ),
      Effect.repeat(HeartbeatCore.roundSchedule(data.intervalMs)),
      Effect.forkChild
    )
    send({ t: "ready" })
    yield* Deferred.await(stop)
  })
  Effect.runFork(
    program.pipe(
      Effect.scoped,
      Effect.provide(
        PgQueueStorage.layer({ schema: data.schema }).pipe(Layer.provideMerge(clientLayer(data.connection)))
      ),
      Effect.catchCause((cause) => Effect.sync(() => send({ t: "failed", message: firstLine(cause) }))),
      Effect.ensuring(Effect.sync(() => port.close()))
    )
  )
}

if (parentPort !== null) run(parentPort, workerData as ThreadData)
