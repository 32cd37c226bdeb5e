/**
 * Entry point of the heartbeat thread (`Heartbeats.layerThread`): a `worker_threads` thread with
 * its own connection that heartbeats the attempts the main thread tells it about, on its own
 * timer, so a handler blocking the main event loop cannot stop them (capabilities.md §6).
 *
 * The thread belongs to the `Heartbeats` layer, not to one worker: it serves one worker session
 * at a time, and between sessions it stays connected and idle (no rounds, no watchdog).
 *
 * **Protocol** (structured-clone messages; bigints survive the clone)
 * - main → thread: `session` {s, intervalMs, maxStallMs, tick, segments} (a session begins; its
 *   attempts are in the shared segments of its `AttemptTable`, read in each round, so holding
 *   and letting go of an attempt sends nothing); `segment` {s, buffers} (the table grew);
 *   `progress` [handle, progress, generation][]; `flush` {id, handle, progress, generation};
 *   `end` {s} (the session is over: forget its attempts); `stop` (the layer is closing: close
 *   the connection and exit).
 * - thread → main: `ready` (connected), `failed` {message} (could not start), `closed`
 *   {s, tokens: [jobId, runLease][]} (attempts a heartbeat found closed), `flushed` {id, error?},
 *   `ended` {s} (no write of that session is in flight and none will follow), `warn` {message}.
 * - Liveness: the main thread stores `Date.now()` in the session's `tick` (a shared
 *   `BigInt64Array`) every `tickMs`. Once that is older than `maxStallMs` the main loop is
 *   presumed stuck for good and the thread stops heartbeating, so the process's attempts are
 *   rescued as if it had died.
 *
 * This module is a program, not a library: it runs its own Effect with `Effect.runFork`. It is
 * loaded by path (see `Heartbeats.threadEntry`), so it imports only what the thread needs.
 */
import { parentPort, workerData } from "node:worker_threads"
import { PgClient } from "@effect/sql-pg"
import { Cause, Deferred, Effect, Fiber, Layer, Queue, Redacted } from "effect"
import { SqlClient } from "effect/sql"
import * as AttemptTable from "./AttemptTable.ts"
import * as HeartbeatCore from "./HeartbeatCore.ts"
import * as PgQueueStorage from "./PgQueueStorage.ts"
import { QueueStorage } from "./QueueStorage.ts"
import * as ReadCommitted from "./ReadCommitted.ts"

/** What the main thread hands over at spawn (all structured-cloneable): the layer's, not a session's. */
export interface ThreadData {
  readonly connection: ThreadConnection
  readonly schema: string
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

/** A worker session's settings, sent when it begins (`s` numbers the sessions of one thread). */
export interface SessionData {
  readonly s: number
  readonly intervalMs: number
  readonly maxStallMs: number
  readonly tick: SharedArrayBuffer
}

export type ToThread =
  | ({ readonly t: "session"; readonly segments: ReadonlyArray<AttemptTable.SegmentBuffers> } & SessionData)
  | { readonly t: "segment"; readonly s: number; readonly buffers: AttemptTable.SegmentBuffers }
  | {
      readonly t: "progress"
      readonly p: ReadonlyArray<readonly [number, Readonly<Record<string, unknown>>, number]>
    }
  | {
      readonly t: "flush"
      readonly id: number
      readonly handle: number
      readonly progress: Readonly<Record<string, unknown>>
      readonly generation: number
    }
  | { readonly t: "end"; readonly s: number }
  | { readonly t: "stop" }

export type FromThread =
  | { readonly t: "ready" }
  | { readonly t: "failed"; readonly message: string }
  | { readonly t: "closed"; readonly s: number; readonly tokens: ReadonlyArray<readonly [bigint, bigint]> }
  | { readonly t: "flushed"; readonly id: number; readonly error?: string | undefined }
  | { readonly t: "ended"; readonly s: number }
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

/** The session this thread serves: its attempts' table, its core (writer lock), clock and round fiber. */
interface Session {
  readonly data: SessionData
  readonly attempts: ReturnType<typeof AttemptTable.reader>
  readonly core: HeartbeatCore.HeartbeatCore
  readonly tick: BigInt64Array
  rounds: Fiber.Fiber<unknown, unknown> | undefined
}

/** What needs the connection or a fiber, in arrival order: one at a time, off the message handler. */
type Command =
  | { readonly t: "begin"; readonly session: Session }
  | { readonly t: "flush"; readonly session: Session; readonly f: Extract<ToThread, { t: "flush" }> }
  | { readonly t: "end"; readonly session: Session }

const run = (port: NonNullable<typeof parentPort>, data: ThreadData) => {
  const send = (message: FromThread) => port.postMessage(message)
  const program = Effect.gen(function* () {
    const sql = yield* SqlClient.SqlClient
    yield* sql`SELECT 1` // connected, or the thread reports why not
    const storage = yield* QueueStorage
    const commands = yield* Queue.unbounded<Command>()
    const stop = yield* Deferred.make<void>()
    let session: Session | undefined
    /** A session as the main thread began it: its settings, and a reader of its attempts' table. */
    const sessionOf = ({ segments, ...data }: Extract<ToThread, { t: "session" }>): Session => {
      const attempts = AttemptTable.reader(segments)
      return {
        data,
        attempts,
        core: HeartbeatCore.make(storage, data.intervalMs, attempts),
        tick: new BigInt64Array(data.tick),
        rounds: undefined
      }
    }
    // Segments and progress change plain state at once; the rest is queued in arrival order.
    port.on("message", (message: ToThread) => {
      switch (message.t) {
        case "session":
          // the main thread waits for `ended` before it begins another; a restart may repeat one
          if (session !== undefined) Queue.offerUnsafe(commands, { t: "end", session })
          session = sessionOf(message)
          Queue.offerUnsafe(commands, { t: "begin", session })
          return
        case "segment":
          if (session !== undefined && session.data.s === message.s)
            session.attempts.addSegment(message.buffers)
          return
        case "progress":
          if (session !== undefined)
            for (const [handle, progress, generation] of message.p)
              session.core.setProgress(handle, progress, generation)
          return
        case "flush":
          if (session === undefined) send({ t: "flushed", id: message.id, error: "no heartbeat session" })
          else Queue.offerUnsafe(commands, { t: "flush", session, f: message })
          return
        case "end":
          if (session !== undefined && session.data.s === message.s) {
            Queue.offerUnsafe(commands, { t: "end", session })
            session = undefined
          } else send({ t: "ended", s: message.s })
          return
        case "stop":
          Deferred.doneUnsafe(stop, Effect.void)
          return
      }
    })
    /** A session's rounds, every interval, until it ends (or its main loop stalls past `maxStallMs`). */
    const rounds = (session: Session) => {
      let stalled = false
      const round = Effect.gen(function* () {
        const silentMs = Date.now() - Number(Atomics.load(session.tick, 0))
        if (silentMs > session.data.maxStallMs) {
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
        const closed = yield* session.core.beat.pipe(
          Effect.retry(HeartbeatCore.retryRound(session.data.intervalMs))
        )
        if (closed.length > 0)
          send({ t: "closed", s: session.data.s, tokens: closed.map((c) => [c.jobId, c.runLease] as const) })
      })
      return round.pipe(
        Effect.catchCause((cause) =>
          Effect.sync(() => send({ t: "warn", message: `heartbeat failed: ${firstLine(cause)}` }))
        ),
        Effect.repeat(HeartbeatCore.roundSchedule(session.data.intervalMs))
      )
    }
    const execute = (command: Command) => {
      switch (command.t) {
        case "begin":
          return Effect.map(Effect.forkChild(rounds(command.session)), (fiber) => {
            command.session.rounds = fiber
          })
        case "flush": {
          const f = command.f
          return command.session.core.flush(f.handle, f.progress, f.generation).pipe(
            Effect.matchCause({
              onSuccess: () => send({ t: "flushed", id: f.id }),
              onFailure: (cause) => send({ t: "flushed", id: f.id, error: firstLine(cause) })
            })
          )
        }
        case "end":
          // the write in flight finishes first (the core's lock); then nothing of it is tracked
          return command.session.core.close.pipe(
            Effect.andThen(
              command.session.rounds === undefined ? Effect.void : Fiber.interrupt(command.session.rounds)
            ),
            Effect.andThen(Effect.sync(() => send({ t: "ended", s: command.session.data.s })))
          )
      }
    }
    yield* Queue.take(commands).pipe(Effect.flatMap(execute), Effect.forever, Effect.forkChild)
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
