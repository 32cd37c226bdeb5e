/**
 * `Heartbeats`: who keeps a process's attempts alive (capabilities.md §6). The worker starts one
 * session for its lifetime, tells it which attempts it holds and their progress, and interrupts
 * the attempts the session reports closed.
 *
 * - `layerThread` (Postgres, the default of `Awa.layerPg`): heartbeats are written by a
 *   `worker_threads` thread with its own connection (`HeartbeatThread.ts`), on its own timer. A
 *   handler that blocks the main event loop (CPU-bound work, a huge `JSON.parse`) no longer stops
 *   them, so its process's attempts are not falsely rescued. Watchdog: the main thread stamps a
 *   shared clock every tick; after `maxStallMs` without a stamp the thread stops heartbeating, so
 *   a process that never recovers is still rescued. The thread belongs to the layer (loading it
 *   costs about a second of CPU): spawned by the first session, idle between sessions, reused by
 *   the next one; a second is spawned only for a session that starts while the first is busy.
 * - `makeLoop` / `layerLoop`: the same heartbeats as a fiber on the main event loop (the
 *   simulation layer, `watchdog: { thread: false }`, or a `PgClient` whose connection settings
 *   cannot be handed to a thread, such as a custom `stream`).
 *
 * **Guarantees** `start` returns once the thread is connected (or could not start, or after
 * 60 s), so a worker claims nothing before its heartbeats are off the event loop. `track`
 * writes the attempt into the session's `AttemptTable`, shared memory the thread reads in each
 * round: it is covered once `track` returns, even if a handler blocks the event loop right after,
 * and neither `track` nor `untrack` sends a message (docs/adr/0040-attempt-table.md). Rounds
 * start every interval (a slow one is followed by the next at once), and a failed round is
 * retried after 10 ms, backing off to 100 ms, for up to an interval: a terminated connection is
 * replaced on the first retry (`HeartbeatCore.roundSchedule`, `retryRound`). Progress is batched
 * onto the next tick. Closing the session's scope ends the session in the thread: once its
 * write in flight is done it forgets every attempt of the session (none is heartbeated under the
 * next one) and its watchdog is disarmed; a thread that does not answer within 5 s is terminated.
 * Closing the layer's scope stops the threads (each finishes its current write and closes its
 * connection; terminated after 5 s).
 *
 * **Gotchas** The thread is loaded from `HeartbeatThread.ts` next to this module when running
 * from source (Node type stripping, vitest) and from `HeartbeatThread.js` in compiled output: see
 * `threadEntry`. It needs a connection of its own, one more per worker process (per concurrent
 * worker session), held until the layer closes.
 */
import { Worker as NodeWorker } from "node:worker_threads"
import { Migrations } from "@awa/sql"
import { PgClient } from "@effect/sql-pg"
import { Context, Deferred, Duration, Effect, Layer, Queue, Redacted, type Scope, Stream } from "effect"
import { SqlError, UnknownError } from "effect/sql/SqlError"
import * as AttemptTable from "./AttemptTable.ts"
import * as HeartbeatCore from "./HeartbeatCore.ts"
import type { FromThread, SessionData, ThreadConnection, ThreadData, ToThread } from "./HeartbeatThread.ts"
import { type AttemptToken, QueueStorage } from "./QueueStorage.ts"

export interface HeartbeatOptions {
  /** Heartbeat round every this many ms; attempts held at least half of it are heartbeated. */
  readonly intervalMs: number
  /** Thread only: stop heartbeating once the main event loop has not ticked for this long. */
  readonly maxStallMs: number
}

export interface HeartbeatSession {
  readonly mode: "thread" | "loop"
  /**
   * An attempt the process now holds, since `heldAt` (ms since the epoch): heartbeated from now
   * on. The answer is its handle for the calls below.
   */
  readonly track: (jobId: bigint, runLease: bigint, heldAt: number) => number
  /** An attempt the process no longer holds; a handle already let go does nothing. */
  readonly untrack: (handle: number) => void
  /** Newer progress (`generation` increases per attempt): carried by the next heartbeat. */
  readonly progress: (handle: number, progress: Readonly<Record<string, unknown>>, generation: number) => void
  /**
   * Writes progress now, ordered with the heartbeats; a no-op once the attempt is let go (and a
   * no-op write in storage once it is closed).
   */
  readonly flush: (
    handle: number,
    progress: Readonly<Record<string, unknown>>,
    generation: number
  ) => Effect.Effect<void, SqlError>
  /** Attempts a heartbeat found closed (cancelled, rescued): the worker interrupts them. */
  readonly closed: Stream.Stream<AttemptToken>
}

export class Heartbeats extends Context.Service<
  Heartbeats,
  {
    /** Starts a session for the caller's scope. */
    readonly start: (options: HeartbeatOptions) => Effect.Effect<HeartbeatSession, SqlError, Scope.Scope>
  }
>()("@awa/storage/Heartbeats") {}

/** Heartbeats as a fiber on the current event loop. */
export const makeLoop = (options: HeartbeatOptions) =>
  Effect.gen(function* () {
    const table = AttemptTable.make()
    const core = HeartbeatCore.make(yield* QueueStorage, options.intervalMs, table)
    const closed = yield* Queue.unbounded<AttemptToken>()
    yield* core.beat.pipe(
      Effect.retry(HeartbeatCore.retryRound(options.intervalMs)),
      Effect.flatMap((tokens) => Queue.offerAll(closed, tokens)),
      Effect.catchCause((cause) => Effect.logWarning("heartbeat failed", cause)),
      Effect.repeat(HeartbeatCore.roundSchedule(options.intervalMs)),
      Effect.annotateLogs({ module: "Heartbeats", fiber: "heartbeat" }),
      Effect.forkScoped
    )
    return {
      mode: "loop",
      track: table.add,
      untrack: table.remove,
      progress: core.setProgress,
      flush: core.flush,
      closed: Stream.fromQueue(closed)
    } satisfies HeartbeatSession
  })

/** Heartbeats on the current event loop, whatever the storage layer. */
export const layerLoop: Layer.Layer<Heartbeats, never, QueueStorage> = Layer.effect(
  Heartbeats,
  Effect.map(QueueStorage, (storage) =>
    Heartbeats.of({ start: (options) => Effect.provideService(makeLoop(options), QueueStorage, storage) })
  )
)

/**
 * The thread's entry module, next to this one: `.ts` when this module runs from source (Node
 * 24's type stripping, vitest), `.js` when it runs compiled (`tsc` rewrites import specifiers,
 * not this URL, so the extension follows this module's own).
 */
export const threadEntry: URL = import.meta.url.endsWith(".ts")
  ? new URL("./HeartbeatThread.ts", import.meta.url)
  : new URL("./HeartbeatThread.js", import.meta.url)

const sqlError = (message: string) =>
  new SqlError({ reason: new UnknownError({ cause: new Error(message), message }) })

const millis = (input: Duration.Input | undefined) =>
  input === undefined ? undefined : Duration.toMillis(Duration.fromInputUnsafe(input))

/**
 * The client's connection settings as plain values a thread can receive, or the reason they
 * cannot be handed over (then the session runs on the event loop).
 */
const threadConnection = (config: PgClient.PgClientConfig) =>
  Effect.gen(function* (): Effect.fn.Return<ThreadConnection | string> {
    if (config.stream !== undefined) return "the PgClient uses a custom stream"
    let password: string | undefined
    if (config.password !== undefined)
      password = Redacted.value(
        Redacted.isRedacted(config.password) ? config.password : yield* config.password
      )
    if (config.ssl !== undefined && typeof config.ssl !== "boolean") {
      try {
        structuredClone(config.ssl)
      } catch {
        return "the PgClient's TLS options cannot be copied to a thread"
      }
    }
    return {
      url: config.url === undefined ? undefined : Redacted.value(config.url),
      host: config.host,
      port: config.port,
      path: config.path,
      ssl: config.ssl,
      database: config.database,
      username: config.username,
      password,
      connectTimeoutMs: millis(config.connectTimeout),
      keepAliveMs: millis(config.keepAlive),
      applicationName: `${config.applicationName ?? "awa"} heartbeat`,
      startupParameters: config.startupParameters,
      startupOptions: config.startupOptions
    }
  })

/**
 * Heartbeats from a thread with its own connection, opened with the application's `PgClient`
 * settings. Falls back to `makeLoop` (with a warning) when those cannot be handed to a thread.
 *
 * The threads belong to this layer: the first `start` spawns one (building the layer spawns
 * nothing, so a producer-only process never loads it), a session that ends hands it back idle,
 * and the next session reuses it. Concurrent sessions (two workers on one layer) each get a
 * thread of their own: a second is spawned only while the first is busy. Closing the layer's
 * scope stops them all.
 */
export const layerThread = (options: { readonly schema?: string | undefined } = {}) =>
  Layer.effect(
    Heartbeats,
    Effect.gen(function* () {
      const client = yield* PgClient.PgClient
      const storage = yield* QueueStorage
      const schema = yield* Migrations.checkSchemaName(options.schema ?? Migrations.defaultSchema)
      const threads = yield* makeThreads(schema, storage)
      return Heartbeats.of({
        start: (o) =>
          Effect.gen(function* () {
            const connection = yield* threadConnection(client.config)
            if (typeof connection === "string") {
              yield* Effect.logWarning(`heartbeats run on the event loop: ${connection}`)
              return yield* Effect.provideService(makeLoop(o), QueueStorage, storage)
            }
            return yield* threads.session(o, connection)
          })
      })
    })
  )

/** How long a session waits for its thread before it starts with heartbeats on the event loop. */
const threadStartTimeoutMs = 60_000

/** How long a thread may take to finish its write when a session ends or the layer closes. */
const threadStopTimeoutMs = 5000

/**
 * The thread's young generation, in MB (V8's default is sized for a main thread: up to 48 MB at
 * 16 MB semi-spaces). The thread keeps little alive, and when it still received a `track` and an
 * `untrack` message per claimed job (before ADR 0040) V8 grew its heap to 170–210 MB under a busy
 * drain (40–100 MB used): 95–110 MB of a worker process's RSS in `bench/src/soak.ts`, for no
 * throughput (docs/benchmarks.md, "A steady drain with a producer, and a worker's memory"). Now
 * it reads the attempts from shared memory and allocates per round, not per job. Only the young
 * generation is capped: an old generation limit would end the thread with an out-of-memory error
 * under enough in-flight work.
 */
const threadYoungGenerationMb = 4

/** One thread spawned, from spawn to exit; `ready` settles once it is connected (or could not be). */
interface Spawned {
  readonly worker: NodeWorker
  readonly ready: Deferred.Deferred<void, SqlError>
  readonly exited: Deferred.Deferred<number>
}

/**
 * The main thread's side of a session: what the thread must be told again if it is restarted
 * (its settings and its attempts' table, whose memory a new thread shares at once).
 */
interface SessionState {
  readonly data: SessionData
  readonly table: AttemptTable.AttemptTable
  readonly closed: Queue.Queue<AttemptToken>
}

/**
 * A thread of the layer, kept across sessions and restarted by its supervisor when it dies.
 * `ready` is the thread once connected; `current` the latest spawned, ready or not.
 */
interface Slot {
  current: Spawned | undefined
  ready: NodeWorker | undefined
  /** Settles once the slot's first thread is up or could not start. */
  readonly firstStart: Deferred.Deferred<void>
  session: SessionState | undefined
  /** Settles when the thread answers `end` for session `s` (or exits). */
  ending: { readonly s: number; readonly done: Deferred.Deferred<void> } | undefined
  /** Terminated after it did not end a session in time: never restarted nor reused. */
  retired: boolean
  readonly flushWaiters: Map<number, (error: string | undefined) => void>
}

/**
 * The layer's threads: `session` borrows an idle one or spawns one, and gives it back when the
 * caller's scope closes, with every attempt of that session forgotten by the thread.
 */
const makeThreads = (schema: string, storage: QueueStorage["Service"]) =>
  Effect.gen(function* () {
    const layerScope = yield* Effect.scope
    const slots = new Set<Slot>()
    const idle: Array<Slot> = []
    const warnings = yield* Queue.unbounded<string>()
    let nextFlush = 0
    let nextSession = 0
    let stopping = false
    yield* Stream.fromQueue(warnings).pipe(
      Stream.runForEach((message) => Effect.logWarning(message)),
      Effect.forkScoped
    )
    // Closing the layer: stop every thread, let it close its connection, and only terminate it if
    // it does not exit in time. Registered before any supervisor is forked into this scope, so it
    // runs after they are interrupted (none restarts a thread meanwhile).
    yield* Effect.addFinalizer(() =>
      Effect.suspend(() => {
        stopping = true
        return Effect.forEach(
          slots,
          (slot) =>
            Effect.gen(function* () {
              const spawned = slot.current
              if (spawned === undefined) return
              spawned.worker.postMessage({ t: "stop" } satisfies ToThread)
              const exited = yield* Deferred.await(spawned.exited).pipe(
                Effect.timeoutOption(threadStopTimeoutMs)
              )
              if (exited._tag === "None") yield* Effect.promise(() => spawned.worker.terminate())
            }),
          { concurrency: "unbounded", discard: true }
        )
      })
    )

    const post = (slot: Slot, message: ToThread) => slot.current?.worker.postMessage(message)
    const postSession = (slot: Slot, session: SessionState) =>
      post(slot, { t: "session", ...session.data, segments: session.table.buffers() })

    /**
     * An idle thread does not keep the process alive (as before, when it lived only as long as
     * its worker): only a thread serving a session does.
     */
    const holdProcess = (slot: Slot) => {
      if (slot.session === undefined) slot.current?.worker.unref()
      else slot.current?.worker.ref()
    }

    const spawn = (slot: Slot, connection: ThreadConnection): Spawned => {
      const data: ThreadData = { connection, schema }
      const worker = new NodeWorker(threadEntry, {
        workerData: data,
        name: "awa-heartbeat",
        resourceLimits: { maxYoungGenerationSizeMb: threadYoungGenerationMb }
      })
      const ready = Deferred.makeUnsafe<void, SqlError>()
      const exited = Deferred.makeUnsafe<number>()
      worker.on("message", (message: FromThread) => {
        switch (message.t) {
          case "ready":
            Deferred.doneUnsafe(ready, Effect.void)
            return
          case "failed":
            Deferred.doneUnsafe(ready, Effect.fail(sqlError(`heartbeat thread: ${message.message}`)))
            Queue.offerUnsafe(warnings, `heartbeat thread failed: ${message.message}`)
            return
          case "closed":
            // only the session that tracked them: one that ended has nothing left to interrupt
            if (slot.session?.data.s === message.s)
              for (const [jobId, runLease] of message.tokens)
                Queue.offerUnsafe(slot.session.closed, { jobId, runLease })
            return
          case "flushed":
            slot.flushWaiters.get(message.id)?.(message.error)
            slot.flushWaiters.delete(message.id)
            return
          case "ended":
            if (slot.ending?.s === message.s) Deferred.doneUnsafe(slot.ending.done, Effect.void)
            return
          case "warn":
            Queue.offerUnsafe(warnings, message.message)
            return
        }
      })
      worker.on("error", (error) => {
        Deferred.doneUnsafe(ready, Effect.die(error))
        Queue.offerUnsafe(warnings, `heartbeat thread error: ${error.message}`)
      })
      worker.on("exit", (code) => {
        Deferred.doneUnsafe(
          ready,
          Effect.die(new Error(`heartbeat thread exited (${code}) before it was ready`))
        )
        Deferred.doneUnsafe(exited, Effect.succeed(code))
        // a thread that is gone writes nothing more
        if (slot.ending !== undefined) Deferred.doneUnsafe(slot.ending.done, Effect.void)
        for (const waiter of slot.flushWaiters.values()) waiter("heartbeat thread exited")
        slot.flushWaiters.clear()
      })
      return { worker, ready, exited }
    }

    // Supervisor of a slot: starts its thread, and replaces one that dies (after 1 s), telling it
    // again the session it serves and which attempts that session holds.
    const supervise = (slot: Slot, connection: ThreadConnection) =>
      Effect.gen(function* () {
        while (!stopping && !slot.retired) {
          const spawned = spawn(slot, connection)
          slot.current = spawned
          holdProcess(slot)
          if (slot.session !== undefined) postSession(slot, slot.session)
          const started = yield* Effect.exit(Deferred.await(spawned.ready))
          Deferred.doneUnsafe(slot.firstStart, Effect.void)
          if (started._tag === "Failure") {
            yield* Effect.logWarning(
              "heartbeat thread could not start; heartbeats stay on the event loop",
              started.cause
            )
          } else {
            slot.ready = spawned.worker
          }
          const code = yield* Deferred.await(spawned.exited)
          slot.ready = undefined
          if (stopping || slot.retired) break
          if (started._tag === "Success")
            yield* Effect.logWarning(`heartbeat thread exited (code ${code}); restarting it in 1 s`)
          yield* Effect.sleep(1000)
        }
        // a retired slot is gone for good; while the layer closes, its finalizer still needs them
        if (!stopping) slots.delete(slot)
      })

    /** An idle thread, or a new one (its supervisor lives in the layer's scope). */
    const borrow = (connection: ThreadConnection) =>
      Effect.gen(function* () {
        const reused = idle.pop()
        if (reused !== undefined) return reused
        const slot: Slot = {
          current: undefined,
          ready: undefined,
          firstStart: Deferred.makeUnsafe<void>(),
          session: undefined,
          ending: undefined,
          retired: false,
          flushWaiters: new Map()
        }
        slots.add(slot)
        yield* Effect.forkIn(supervise(slot, connection), layerScope)
        return slot
      })

    /**
     * Ends the slot's session: the thread forgets its attempts once its write in flight is done
     * (`ended`), then the slot is idle again. A thread that does not answer in time is terminated
     * and retired, so nothing of the session can be written after this returns.
     */
    const giveBack = (slot: Slot, session: SessionState) =>
      Effect.gen(function* () {
        const done = Deferred.makeUnsafe<void>()
        slot.ending = { s: session.data.s, done }
        slot.session = undefined
        post(slot, { t: "end", s: session.data.s })
        // an exited thread (restarting) holds nothing: `exit` settles `done` as well
        if (slot.current === undefined || Deferred.isDoneUnsafe(slot.current.exited))
          Deferred.doneUnsafe(done, Effect.void)
        const ended = yield* Deferred.await(done).pipe(Effect.timeoutOption(threadStopTimeoutMs))
        slot.ending = undefined
        if (ended._tag === "Some") {
          holdProcess(slot)
          if (!stopping) idle.push(slot)
          return
        }
        slot.retired = true
        const spawned = slot.current
        if (spawned !== undefined) {
          yield* Effect.logWarning(
            `heartbeat thread did not end its session within ${threadStopTimeoutMs} ms; terminating it`
          )
          yield* Effect.promise(() => spawned.worker.terminate())
        }
      })

    const session = (
      options: HeartbeatOptions,
      connection: ThreadConnection
    ): Effect.Effect<HeartbeatSession, never, Scope.Scope> =>
      Effect.gen(function* () {
        const tickBuffer = new SharedArrayBuffer(8)
        const tick = new BigInt64Array(tickBuffer)
        const stamp = () => Atomics.store(tick, 0, BigInt(Date.now()))
        stamp()
        const s = nextSession++
        // a segment added later (more attempts held at once than ever before) goes to the thread
        // serving the session; a thread started after it gets every segment with the session
        let serving: Slot | undefined
        const state: SessionState = {
          data: { s, intervalMs: options.intervalMs, maxStallMs: options.maxStallMs, tick: tickBuffer },
          table: AttemptTable.make((buffers) => {
            if (serving !== undefined) post(serving, { t: "segment", s, buffers })
          }),
          closed: yield* Queue.unbounded<AttemptToken>()
        }
        const slot = yield* Effect.acquireRelease(
          Effect.map(borrow(connection), (slot) => {
            slot.session = state
            serving = slot
            holdProcess(slot)
            // to the current thread, ready or not: a thread queues what arrives before it
            // listens, so what is tracked meanwhile is covered from the moment it is up
            postSession(slot, state)
            return slot
          }),
          (slot) => giveBack(slot, state)
        )
        const pendingProgress = new Map<
          number,
          readonly [number, Readonly<Record<string, unknown>>, number]
        >()

        // The main thread's tick: liveness for the watchdog, then what waited for a batch. A plain
        // timer: it measures the event loop itself, whatever clock the Effect runtime uses.
        const tickMs = Math.max(10, Math.min(1000, Math.floor(options.intervalMs / 4)))
        const timer = setInterval(() => {
          stamp()
          if (pendingProgress.size > 0) {
            post(slot, { t: "progress", p: [...pendingProgress.values()] })
            pendingProgress.clear()
          }
        }, tickMs)
        timer.unref()
        yield* Effect.addFinalizer(() => Effect.sync(() => clearInterval(timer)))

        // The session is handed out once its thread is up (or could not start), so the worker
        // claims nothing before its heartbeats are off the event loop. Loading Effect again in the
        // thread's isolate costs about a second of CPU; while three processes did that beside
        // their first claims on a loaded 2-core machine, the event loop and pool fell so far
        // behind that attempts went 1.5 s without a heartbeat and were rescued (fault suite,
        // scenario 2; ADR 0019). A reused thread is up already.
        const up = yield* Deferred.await(slot.firstStart).pipe(Effect.timeoutOption(threadStartTimeoutMs))
        if (up._tag === "None")
          yield* Effect.logWarning(
            `heartbeat thread not ready after ${threadStartTimeoutMs} ms; heartbeats run on the event loop until it is`
          )
        // While no thread is ready (starting, restarting, could not connect): the held attempts'
        // heartbeats on the event loop (no progress: finalization and flushes still write it).
        const bridge = Effect.gen(function* () {
          if (slot.ready !== undefined) return
          const now = Date.now()
          const due: Array<AttemptToken> = []
          state.table.forEachHeld((_, jobId, runLease, heldAt) => {
            if (now - heldAt >= options.intervalMs / 2) due.push({ jobId, runLease })
          })
          for (let i = 0; i < due.length; i += 500) {
            const notOpen = yield* HeartbeatCore.heartbeatOutsideTransaction(storage, due.slice(i, i + 500))
            yield* Queue.offerAll(state.closed, notOpen)
          }
        })
        yield* bridge.pipe(
          Effect.retry(HeartbeatCore.retryRound(options.intervalMs)),
          Effect.catchCause((cause) => Effect.logWarning("heartbeat failed", cause)),
          Effect.repeat(HeartbeatCore.roundSchedule(options.intervalMs)),
          Effect.annotateLogs({ module: "Heartbeats", fiber: "bridge" }),
          Effect.forkScoped
        )
        return {
          mode: "thread",
          track: state.table.add,
          untrack: (handle) => {
            state.table.remove(handle)
            pendingProgress.delete(handle)
          },
          progress: (handle, progress, generation) => {
            pendingProgress.set(handle, [handle, progress, generation])
          },
          flush: (handle, progress, generation) =>
            Effect.callback<void, SqlError>((resume) => {
              const token = state.table.tokenOf(handle)
              if (token === undefined) {
                resume(Effect.void)
                return
              }
              if (slot.ready === undefined) {
                // no thread ready yet (or restarting): write it from here, and tell the thread, so
                // it never writes an older value after this one
                pendingProgress.delete(handle)
                post(slot, { t: "progress", p: [[handle, progress, generation]] })
                resume(
                  Effect.asVoid(
                    HeartbeatCore.heartbeatOutsideTransaction(storage, [
                      { jobId: token.jobId, runLease: token.runLease, progress }
                    ])
                  )
                )
                return
              }
              const id = nextFlush++
              slot.flushWaiters.set(id, (error) =>
                resume(error === undefined ? Effect.void : Effect.fail(sqlError(error)))
              )
              post(slot, { t: "flush", id, handle, progress, generation })
              return Effect.sync(() => void slot.flushWaiters.delete(id))
            }),
          closed: Stream.fromQueue(state.closed)
        } satisfies HeartbeatSession
      })

    return { session }
  })
