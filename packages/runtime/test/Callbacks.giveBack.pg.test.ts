/**
 * A resumed parked job that a stopping worker took back but never started keeps its resume
 * (migration 0035, capabilities.md §17): it is parked again as resumed, and the next worker runs
 * it with the payload and the same run lease. Before, the stopping worker gave it back as a
 * snooze: the attempt closed, its resume payload went with it, and the job started over waiting
 * for a callback that had already come.
 */
import { Job } from "@awa/core"
import { TestDatabase } from "@awa/testing"
import { assert, describe, it } from "@effect/vitest"
import { Deferred, Effect, Exit, Layer, Schema, Scope } from "effect"
import { SqlClient } from "effect/sql"
import * as Awa from "../src/Awa.ts"
import { AwaClient } from "../src/AwaClient.ts"
import { Callbacks } from "../src/Callbacks.ts"
import { handler } from "../src/Handler.ts"
import { eventually } from "./support.ts"

const Args = Schema.Struct({ n: Schema.Number })
const Approval = Job.define({ kind: "approval", args: Args, queue: "gb" })
const Blocker = Job.define({ kind: "blocker", args: Args, queue: "gb" })

const sentOut: Array<string> = []
const runs: Array<{ readonly lease: bigint; readonly result: unknown }> = []

const handlersWith = (blocked: Deferred.Deferred<void>, blockerStarted: Deferred.Deferred<void>) => [
  handler(Approval, (_args, ctx) =>
    Effect.gen(function* () {
      runs.push({ lease: ctx.job.runLease, result: ctx.callbackResult })
      if (ctx.callbackResult !== undefined) return Job.JobResult.completed
      const token = yield* ctx.registerCallback({ timeout: "1 hour" })
      sentOut.push(token.id)
      return Job.JobResult.waitForCallback(token)
    })
  ),
  // holds the queue's only slot until the test lets it go (or the worker's shutdown interrupts it)
  handler(Blocker, () => Effect.andThen(Deferred.succeed(blockerStarted, undefined), Deferred.await(blocked)))
]

const fastMaintenance = {
  electionInterval: "50 millis",
  promoteInterval: "20 millis",
  rescueInterval: "100 millis",
  rotateInterval: "100 millis"
} as const

const AwaLive = Awa.layerPg().pipe(Layer.provideMerge(TestDatabase.layer({ maxConnections: 12 })))

const callbackRow = (jobId: bigint) =>
  Effect.flatMap(SqlClient.SqlClient, (sql) =>
    Effect.map(
      sql<{ waiting: boolean; state: string | null; lease: string }>`
        SELECT a.callback_waiting AS waiting, a.callback_state AS state, a.run_lease::text AS lease
        FROM awa.attempt_state a WHERE a.job_id = ${jobId}`,
      (rows) => rows[0]
    )
  )

describe("a resumed job given back at shutdown", () => {
  it.live("is resumed again: the next worker runs it with the payload and the same run lease", () =>
    Effect.gen(function* () {
      const blocked = yield* Deferred.make<void>()
      const blockerStarted = yield* Deferred.make<void>()
      const worker = Awa.worker({
        queues: { gb: { maxConcurrency: 1, prefetch: 1 } },
        handlers: handlersWith(blocked, blockerStarted),
        maintenance: fastMaintenance,
        shutdownTimeout: "200 millis"
      })
      const client = yield* AwaClient
      const callbacks = yield* Callbacks
      const approval = yield* client.insert(Approval, { n: 1 })

      // worker A: parks the approval, then runs the blocker, and takes the resumed approval into
      // its buffer (prefetch 1) behind it; then it stops with the approval unstarted
      // closed before AwaLive even when a step below fails: a worker left running on a closed
      // pool retries every call in a loop and hides the failure behind a timeout
      const scopeA = yield* Effect.acquireRelease(Scope.make(), (scope) => Scope.close(scope, Exit.void))
      yield* Layer.buildWithScope(worker, scopeA)
      yield* eventually(
        Effect.sync(() => sentOut.length === 1),
        20_000,
        "the approval parked"
      )
      const parkedLease = runs[0]!.lease
      yield* client.insert(Blocker, { n: 2 })
      // the blocker holds the slot before the resume arrives (else the resumed approval may be
      // taken and started before the blocker is claimed)
      yield* Deferred.await(blockerStarted)
      yield* callbacks.resumeExternal(sentOut[0]!, { approved: true })
      yield* eventually(
        Effect.map(callbackRow(approval.id), (r) => r !== undefined && !r.waiting && r.state === null),
        20_000,
        "worker A took the resumed approval back"
      )
      assert.strictEqual(runs.length, 1, "taken back, not started: the blocker holds the slot")
      yield* Scope.close(scopeA, Exit.void)

      // given back as resumed, with its lease: not closed and snoozed
      const row = yield* callbackRow(approval.id)
      assert.deepStrictEqual(row, { waiting: true, state: "resumed", lease: String(parkedLease) })

      // worker B takes it back and runs it with the payload
      yield* Deferred.succeed(blocked, undefined)
      yield* Effect.scoped(
        Effect.gen(function* () {
          yield* Layer.buildWithScope(worker, yield* Effect.scope)
          yield* eventually(
            Effect.sync(() => runs.length === 2),
            20_000,
            "worker B ran the approval"
          )
        })
      )
      assert.deepStrictEqual(runs[1], { lease: parkedLease, result: { approved: true } })
    }).pipe(Effect.scoped, Effect.provide(AwaLive))
  )
})
