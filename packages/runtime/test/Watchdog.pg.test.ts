/**
 * A handler that blocks the event loop (CPU-bound work) must not get its process's attempts
 * rescued as dead (capabilities.md §6): heartbeats come from a thread with its own connection.
 * The rescuer runs in another thread, as a leader in another process would, so it sweeps while
 * the worker's loop is blocked.
 */
import { Worker as NodeWorker } from "node:worker_threads"
import { Job } from "@awa/core"
import { TestDatabase } from "@awa/testing"
import { PgClient } from "@effect/sql-pg"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Exit, Layer, Redacted, Schema, Scope } from "effect"
import { SqlClient } from "effect/sql"
import * as Awa from "../src/Awa.ts"
import { AwaClient } from "../src/AwaClient.ts"
import { handler } from "../src/Handler.ts"
import type { WorkerOptions } from "../src/Worker.ts"
import { eventually } from "./support.ts"

const Crunch = Job.define({ kind: "crunch", args: Schema.Struct({ ms: Schema.Number }), queue: "cpu" })

const intervalMs = 250
const stalenessMs = 2000
const blockMs = 3 * stalenessMs

/** Blocks the event loop: nothing else of this thread runs meanwhile. */
const busy = (ms: number) => {
  const until = Date.now() + ms
  while (Date.now() < until) {}
}

const awaOn = (url: string) =>
  Awa.layerPg().pipe(Layer.provideMerge(PgClient.layer({ url: Redacted.make(url), maxConnections: 4 })))

/** The rescuer thread; `rescued` fills with the job ids it rescued. */
const startRescuer = (url: string) =>
  Effect.acquireRelease(
    Effect.callback<{ thread: NodeWorker; rescued: Array<string> }>((resume) => {
      const rescued: Array<string> = []
      const thread = new NodeWorker(new URL("./fixtures/rescuer.thread.ts", import.meta.url), {
        workerData: { url, stalenessMs, everyMs: 100 }
      })
      thread.on("message", (m: { ready?: boolean; rescued?: Array<string> }) => {
        if (m.ready) resume(Effect.succeed({ thread, rescued }))
        if (m.rescued) rescued.push(...m.rescued)
      })
    }),
    ({ thread }) =>
      Effect.callback<void>((resume) => {
        thread.once("exit", () => resume(Effect.void))
        thread.postMessage("stop")
      })
  )

/** Runs one CPU-bound job (attempt 1 blocks the loop for `blockMs`) and reports what happened. */
const crunchOnce = (watchdog: WorkerOptions<never>["watchdog"]) =>
  Effect.gen(function* () {
    const { url } = yield* TestDatabase.acquire()
    const rescuer = yield* startRescuer(url)
    const runs: Array<number> = []
    const scope = yield* Scope.make()
    yield* Layer.buildWithScope(
      Awa.worker({
        queues: { cpu: { pollInterval: "50 millis" } },
        handlers: [
          handler(Crunch, ({ ms }, ctx) =>
            Effect.sync(() => {
              runs.push(ctx.job.attempt)
              if (ctx.job.attempt === 1) busy(ms)
            })
          )
        ],
        heartbeatInterval: intervalMs,
        heartbeatStaleness: stalenessMs,
        watchdog,
        maintenance: false
      }).pipe(Layer.provideMerge(awaOn(url))),
      scope
    )
    const view = yield* Effect.gen(function* () {
      const client = yield* AwaClient
      // The worker is built only once its heartbeat thread is connected (ADR 0019): a job that
      // blocks the loop from the first claim on is covered. No waiting here: the connection is
      // there when the layer is, or the worker claimed before its thread was up.
      if (watchdog?.thread !== false) {
        const sql = yield* SqlClient.SqlClient
        const [threads] = yield* sql<{ n: number }>`
          SELECT count(*)::int AS n FROM pg_stat_activity
          WHERE datname = current_database() AND application_name = 'awa heartbeat'`
        assert.strictEqual(threads!.n, 1, "the heartbeat thread is connected when the worker starts")
      }
      const job = yield* client.insert(Crunch, { ms: blockMs }, { maxAttempts: 3 })
      // attempt 1 finishes its block, or is rescued during it and runs again (promoted by hand:
      // this test has no leader besides the rescuer)
      yield* eventually(
        Effect.gen(function* () {
          yield* Effect.flatMap(AwaClient, (c) => c.storage.promoteDue(10))
          const v = yield* client.storage.getJob(job.id)
          return v.state === "completed" || v.state === "failed"
        }),
        60_000,
        "the job finished"
      )
      return yield* client.storage.getJob(job.id)
    }).pipe(Effect.provide(awaOn(url)))
    yield* Scope.close(scope, Exit.void)
    return { runs, rescued: [...rescuer.rescued], view }
  }).pipe(Effect.scoped)

describe("heartbeats while a handler blocks the event loop", () => {
  it.live(`an attempt blocking the loop for 3× the staleness is not rescued and runs once`, () =>
    Effect.gen(function* () {
      // the default: heartbeats from a thread
      const { runs, rescued, view } = yield* crunchOnce(undefined)
      assert.deepStrictEqual(rescued, [], "the rescuer found no stale attempt")
      assert.deepStrictEqual(runs, [1])
      assert.deepStrictEqual([view.state, view.attempt, view.errors], ["completed", 1, []])
    })
  )

  it.live("past watchdog.maxStall the thread stops vouching, and the attempt is rescued", () =>
    Effect.gen(function* () {
      const { runs, rescued, view } = yield* crunchOnce({ maxStall: "1 second" })
      assert.deepStrictEqual(rescued, [String(view.id)])
      assert.deepStrictEqual(runs, [1, 2])
      assert.deepStrictEqual([view.state, view.attempt], ["completed", 2])
      assert.include(view.errors[0]?.error ?? "", "heartbeat stale")
    })
  )
})
