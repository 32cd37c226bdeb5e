/**
 * The heartbeat thread belongs to the `Heartbeats` layer, not to one worker session (issue 17):
 * loading it costs about a second of CPU, which every worker start used to pay again. Observed
 * without timing, through the thread's connection (`awa heartbeat` in `pg_stat_activity`): the
 * layer spawns nothing until the first session, the next session finds the same backend, and
 * closing the layer ends it. A session that ends must leave nothing of its own tracked: the next
 * session's rounds must not keep heartbeating an attempt the previous one let go.
 */
import { randomUUID } from "node:crypto"
import { TestDatabase } from "@awa/testing"
import { PgClient } from "@effect/sql-pg"
import { assert, describe, it } from "@effect/vitest"
import { Context, Effect, Exit, Layer, Redacted, Schedule, Scope } from "effect"
import { SqlClient } from "effect/sql"
import * as Heartbeats from "../src/Heartbeats.ts"
import { layer as pgLayer } from "../src/PgQueueStorage.ts"
import { type AttemptToken, QueueStorage } from "../src/QueueStorage.ts"

const options = { intervalMs: 100, maxStallMs: 600_000 }

/** Retries `check` every 25 ms until it holds; dies after `timeoutMs` (a generous bound, not a wait). */
const eventually = <E, R>(check: Effect.Effect<boolean, E, R>, label: string, timeoutMs = 30_000) =>
  check.pipe(
    Effect.flatMap((ok) => (ok ? Effect.void : Effect.fail("not yet" as const))),
    Effect.retry(Schedule.spaced("25 millis")),
    Effect.timeoutOrElse({
      duration: timeoutMs,
      orElse: () => Effect.die(new Error(`${label} did not hold within ${timeoutMs} ms`))
    })
  )

/** `Heartbeats.layerThread` on a fresh database, built in a scope the test closes itself. */
const buildLayer = Effect.gen(function* () {
  const { url } = yield* TestDatabase.acquire()
  const layerScope = yield* Scope.make()
  const context = yield* Layer.buildWithScope(
    Heartbeats.layerThread().pipe(
      Layer.provideMerge(pgLayer()),
      Layer.provideMerge(PgClient.layer({ url: Redacted.make(url), maxConnections: 4 }))
    ),
    layerScope
  )
  // observed on a pool of its own: the layer's closes with it
  const observer = yield* Layer.build(PgClient.layer({ url: Redacted.make(url), maxConnections: 1 }))
  const sql = Context.get(observer, SqlClient.SqlClient)
  /** Backends of heartbeat threads on this database. */
  const threadPids = Effect.map(
    sql<{ pid: number }>`
      SELECT pid FROM pg_stat_activity
      WHERE datname = current_database() AND application_name = 'awa heartbeat'
      ORDER BY pid`,
    (rows) => rows.map((r) => r.pid)
  )
  /** A session in a scope of its own. */
  const open = Effect.gen(function* () {
    const scope = yield* Scope.make()
    const session = yield* Context.get(context, Heartbeats.Heartbeats)
      .start(options)
      .pipe(Scope.provide(scope))
    return { session, close: Scope.close(scope, Exit.void) }
  })
  return {
    storage: Context.get(context, QueueStorage),
    sql,
    threadPids,
    open,
    closeLayer: Scope.close(layerScope, Exit.void)
  }
})

describe("the heartbeat thread outlives a worker session", () => {
  it.live("the next session reuses the thread; closing the layer ends its connection", () =>
    Effect.gen(function* () {
      const { threadPids, open, closeLayer } = yield* buildLayer
      assert.deepStrictEqual(yield* threadPids, [], "building the layer spawns no thread")
      const first = yield* open
      // `start` returns once the thread is connected
      const pids = yield* threadPids
      assert.strictEqual(pids.length, 1, "one thread, connected")
      yield* first.close
      const second = yield* open
      assert.deepStrictEqual(yield* threadPids, pids, "the second session has the first one's thread")
      yield* second.close
      assert.deepStrictEqual(yield* threadPids, pids, "kept, idle, after the session")
      yield* closeLayer
      yield* eventually(
        Effect.map(threadPids, (now) => now.length === 0),
        "the thread's connection closed with the layer"
      )
    }).pipe(Effect.scoped)
  )

  it.live("concurrent sessions get a thread each; both are kept for later sessions", () =>
    Effect.gen(function* () {
      const { threadPids, open, closeLayer } = yield* buildLayer
      const a = yield* open
      const b = yield* open
      const pids = yield* threadPids
      assert.strictEqual(pids.length, 2, "a second thread while the first is busy")
      yield* a.close
      yield* b.close
      const c = yield* open
      const d = yield* open
      assert.deepStrictEqual(yield* threadPids, pids, "both reused, none spawned")
      yield* c.close
      yield* d.close
      yield* closeLayer
      yield* eventually(
        Effect.map(threadPids, (now) => now.length === 0),
        "both connections closed with the layer"
      )
    }).pipe(Effect.scoped)
  )

  it.live("an attempt the ended session let go is not heartbeated under the next session", () =>
    Effect.gen(function* () {
      const { storage, sql, open, closeLayer } = yield* buildLayer
      const queue = `reuse-${randomUUID().slice(0, 8)}`
      yield* storage.enqueueMany([
        { kind: "k", queue, args: {} },
        { kind: "k", queue, args: {} }
      ])
      const claimOne = Effect.map(
        storage.claim({ queue, max: 1, deadlineMs: 0, agingIntervalMs: 0 }),
        ([c]) => ({ jobId: c!.jobId, runLease: c!.runLease })
      )
      /** The attempt's last heartbeat (the server's clock, as text: exact), or undefined before any. */
      const heartbeatAt = (t: AttemptToken) =>
        Effect.map(
          sql<{ at: string }>`
            SELECT heartbeat_at::text AS at FROM awa.attempt_state
            WHERE job_id = ${t.jobId} AND run_lease = ${t.runLease}`,
          (rows) => rows[0]?.at
        )
      /** Waits until the attempt's heartbeat differs from `than` (rounds every 100 ms). */
      const movedFrom = (t: AttemptToken, than: string | undefined) =>
        Effect.gen(function* () {
          let seen: string | undefined
          yield* eventually(
            Effect.map(heartbeatAt(t), (at) => {
              seen = at
              return at !== undefined && at !== than
            }),
            "a heartbeat"
          )
          return seen!
        })

      // session 1 holds `a` (due at once: held since the epoch) and ends without untracking it,
      // as a worker does when it shuts down with attempts whose outcome it could not write
      const a = yield* claimOne
      const first = yield* open
      first.session.track(a.jobId, a.runLease, 0)
      const aFirst = yield* movedFrom(a, undefined)
      const aAfter = yield* movedFrom(a, aFirst)
      yield* first.close
      const aAtEnd = yield* heartbeatAt(a)
      assert.isTrue(aAtEnd !== undefined && aAtEnd >= aAfter)

      // session 2 (the same thread) holds `b`: three of its rounds, each of which would have
      // heartbeated `a` too had it stayed tracked
      const b = yield* claimOne
      const second = yield* open
      second.session.track(b.jobId, b.runLease, 0)
      let bAt = yield* movedFrom(b, undefined)
      bAt = yield* movedFrom(b, bAt)
      yield* movedFrom(b, bAt)
      assert.strictEqual(yield* heartbeatAt(a), aAtEnd, "a's heartbeat stopped with its session")
      yield* second.close
      yield* closeLayer
    }).pipe(Effect.scoped)
  )
})
