/**
 * Callbacks end to end on Postgres (capabilities.md §17): a worker, real notifications, the
 * handler API (`ctx.registerCallback`, `JobResult.waitForCallback`, `ctx.waitForCallback`) and the
 * external API (`Callbacks`).
 */
import { Job } from "@awa/core"
import { QueueStorage } from "@awa/storage"
import { TestDatabase } from "@awa/testing"
import { assert, describe, it } from "@effect/vitest"
import { Deferred, Effect, Layer, Schema } from "effect"
import { SqlClient } from "effect/sql"
import * as Awa from "../src/Awa.ts"
import { AwaClient } from "../src/AwaClient.ts"
import { Callbacks } from "../src/Callbacks.ts"
import { handler } from "../src/Handler.ts"
import { eventually } from "./support.ts"

const Args = Schema.Struct({ n: Schema.Number })
const Approval = Job.define({ kind: "approval", args: Args, queue: "cb" })
const Sequence = Job.define({ kind: "sequence", args: Args, queue: "cb" })
const Quick = Job.define({ kind: "quick", args: Args, queue: "cb" })
const BadCel = Job.define({ kind: "bad_cel", args: Args, queue: "cb" })
const Steered = Job.define({ kind: "steered", args: Args, queue: "cb" })

/** Callback ids by job (the "sent out" ids), and what each run of an approval saw. */
const ids = new Map<bigint, Array<string>>()
const runs: Array<{
  readonly id: bigint
  readonly lease: bigint
  readonly attempt: number
  readonly result: unknown
}> = []
const seen: Array<unknown> = []
let celError: string | undefined
const sendOut = (job: bigint, id: string) => ids.set(job, [...(ids.get(job) ?? []), id])

const handlers = [
  handler(Approval, (_args, ctx) =>
    Effect.gen(function* () {
      runs.push({
        id: ctx.job.id,
        lease: ctx.job.runLease,
        attempt: ctx.job.attempt,
        result: ctx.callbackResult
      })
      if (ctx.callbackResult !== undefined) return Job.JobResult.completed
      const token = yield* ctx.registerCallback({ timeout: "1 hour" })
      sendOut(ctx.job.id, token.id)
      return Job.JobResult.waitForCallback(token)
    })
  ),
  handler(Sequence, (_args, ctx) =>
    Effect.gen(function* () {
      for (let step = 0; step < 2; step++) {
        const token = yield* ctx.registerCallback({ timeout: "1 hour" })
        sendOut(ctx.job.id, token.id)
        seen.push(yield* ctx.waitForCallback(token))
      }
    })
  ),
  handler(Quick, () => Effect.void),
  handler(BadCel, (_args, ctx) =>
    Effect.gen(function* () {
      const e = yield* Effect.flip(ctx.registerCallback({ timeout: "1 hour", filter: "payload.ok ==" }))
      celError = e._tag
    })
  ),
  handler(Steered, (_args, ctx) =>
    Effect.gen(function* () {
      const token = yield* ctx.registerCallback({
        timeout: "1 hour",
        filter: "payload.kind == 'final'",
        onFail: "payload.status == 'declined'",
        onComplete: "payload.status == 'paid'"
      })
      sendOut(ctx.job.id, token.id)
      return Job.JobResult.waitForCallback(token)
    })
  )
]

const fastMaintenance = {
  electionInterval: "50 millis",
  promoteInterval: "20 millis",
  rescueInterval: "100 millis",
  rotateInterval: "100 millis"
} as const

const AwaLive = Awa.layerPg().pipe(Layer.provideMerge(TestDatabase.layer({ maxConnections: 12 })))

const stateOf = (id: bigint) =>
  Effect.gen(function* () {
    const storage = yield* QueueStorage
    return yield* storage.getJob(id)
  })

const idsOf = (job: bigint, count: number) =>
  Effect.andThen(
    eventually(
      Effect.sync(() => (ids.get(job)?.length ?? 0) >= count),
      20_000,
      `${count} callback id(s) of job ${job}`
    ),
    Effect.sync(() => ids.get(job)!)
  )

/** Each test has a database of its own, where job ids start at 1 again: forget the last one's. */
const reset = Effect.sync(() => {
  ids.clear()
  runs.length = 0
  seen.length = 0
})

const withWorker = <A, E, R>(body: Effect.Effect<A, E, R>) =>
  Effect.andThen(reset, body).pipe(
    Effect.provide(
      Awa.worker({ queues: { cb: { maxConcurrency: 1 } }, handlers, maintenance: fastMaintenance })
    )
  )

describe("callbacks end to end on Postgres", () => {
  it.live(
    "park frees the permit; completeExternal completes; resumeExternal runs the handler again with the payload and the same run lease",
    () =>
      withWorker(
        Effect.gen(function* () {
          const client = yield* AwaClient
          const callbacks = yield* Callbacks
          const parked = yield* client.insert(Approval, { n: 1 })
          const [id] = yield* idsOf(parked.id, 1)
          yield* eventually(
            Effect.map(stateOf(parked.id), (v) => v.state === "waiting_external"),
            20_000,
            "parked"
          )
          // maxConcurrency 1: a second job runs only because the park freed the permit
          const quick = yield* client.insert(Quick, { n: 2 })
          yield* eventually(
            Effect.map(stateOf(quick.id), (v) => v.state === "completed"),
            20_000,
            "quick ran"
          )
          const done = yield* callbacks.completeExternal(id!)
          assert.strictEqual(done.state, "completed")
          assert.strictEqual((yield* Effect.flip(callbacks.completeExternal(id!)))._tag, "CallbackStale")

          const resumed = yield* client.insert(Approval, { n: 3 })
          const [rid] = yield* idsOf(resumed.id, 1)
          yield* eventually(
            Effect.map(stateOf(resumed.id), (v) => v.state === "waiting_external"),
            20_000,
            "parked"
          )
          yield* callbacks.resumeExternal(rid!, { approvedBy: "ops" })
          yield* eventually(
            Effect.map(stateOf(resumed.id), (v) => v.state === "completed"),
            20_000,
            "resumed run"
          )
          const mine = runs.filter((r) => r.id === resumed.id)
          assert.strictEqual(mine.length, 2)
          assert.strictEqual(mine[1]!.lease, mine[0]!.lease)
          assert.strictEqual(mine[1]!.attempt, mine[0]!.attempt)
          assert.deepStrictEqual(mine[1]!.result, { approvedBy: "ops" })
        })
      ).pipe(Effect.provide(AwaLive)),
    60_000
  )

  it.live(
    "two sequential in-handler waits, each woken by its resume; then the job completes",
    () =>
      withWorker(
        Effect.gen(function* () {
          const client = yield* AwaClient
          const callbacks = yield* Callbacks
          const job = yield* client.insert(Sequence, { n: 1 })
          const [first] = yield* idsOf(job.id, 1)
          yield* callbacks.resumeExternal(first!, { step: 1 })
          const [, second] = yield* idsOf(job.id, 2)
          assert.strictEqual((yield* stateOf(job.id)).state, "running")
          yield* callbacks.resumeExternal(second!, { step: 2 })
          yield* eventually(
            Effect.map(stateOf(job.id), (v) => v.state === "completed"),
            20_000,
            "completed"
          )
          assert.deepStrictEqual(seen.slice(-2), [{ step: 1 }, { step: 2 }])
        })
      ).pipe(Effect.provide(AwaLive)),
    60_000
  )

  it.live(
    "CEL: invalid at registration is InvalidCelExpression; the filter ignores a payload; onFail fails; evaluation error takes the default",
    () =>
      withWorker(
        Effect.gen(function* () {
          const client = yield* AwaClient
          const callbacks = yield* Callbacks
          const bad = yield* client.insert(BadCel, { n: 1 })
          yield* eventually(
            Effect.map(stateOf(bad.id), (v) => v.state === "completed"),
            20_000,
            "bad cel job"
          )
          assert.strictEqual(celError, "InvalidCelExpression")

          const declined = yield* client.insert(Steered, { n: 2 })
          const [d] = yield* idsOf(declined.id, 1)
          yield* eventually(
            Effect.map(stateOf(declined.id), (v) => v.state === "waiting_external"),
            20_000,
            "parked"
          )
          const ignored = yield* callbacks.resolveCallback(d!, { kind: "progress", status: "declined" })
          assert.strictEqual(ignored._tag, "Ignored")
          assert.strictEqual((yield* stateOf(declined.id)).state, "waiting_external")
          const failed = yield* callbacks.resolveCallback(d!, { kind: "final", status: "declined" })
          assert.strictEqual(failed._tag === "Resolved" && failed.action, "fail")
          assert.strictEqual((yield* stateOf(declined.id)).state, "failed")

          const odd = yield* client.insert(Steered, { n: 3 })
          const [o] = yield* idsOf(odd.id, 1)
          yield* eventually(
            Effect.map(stateOf(odd.id), (v) => v.state === "waiting_external"),
            20_000,
            "parked"
          )
          // `payload.kind` is missing: the filter cannot evaluate, so the default action applies
          const fallback = yield* callbacks.resolveCallback(o!, { status: "paid" }, "complete")
          assert.strictEqual(fallback._tag === "Resolved" && fallback.action, "complete")
          assert.strictEqual((yield* stateOf(odd.id)).state, "completed")
        })
      ).pipe(Effect.provide(AwaLive)),
    60_000
  )

  it.live(
    "a parked job whose callback times out is rescued by the leader and runs again",
    () =>
      withWorker(
        Effect.gen(function* () {
          const client = yield* AwaClient
          const sql = yield* SqlClient.SqlClient
          const job = yield* client.insert(Approval, { n: 9 })
          const [id] = yield* idsOf(job.id, 1)
          yield* eventually(
            Effect.map(stateOf(job.id), (v) => v.state === "waiting_external"),
            20_000,
            "parked"
          )
          // the timeout passes (backdated, not slept)
          yield* sql`UPDATE awa.attempt_state SET callback_timeout_at = now() - interval '1 second'
                     WHERE callback_id = ${id!}`
          // rescued (callback timed out, retryable), promoted, claimed again: a second id
          yield* idsOf(job.id, 2)
          const view = yield* stateOf(job.id)
          assert.strictEqual(view.attempt, 2)
          assert.isTrue(view.errors.some((e) => e.error === "callback timed out"))
        })
      ).pipe(Effect.provide(AwaLive)),
    60_000
  )

  it.live(
    "cancelling a job that waits in its handler ends the wait with an interruption",
    () =>
      Effect.gen(function* () {
        yield* reset
        const interrupted = yield* Deferred.make<void>()
        const Waiter = Job.define({ kind: "waiter", args: Args, queue: "cb_cancel" })
        yield* Effect.gen(function* () {
          const client = yield* AwaClient
          const job = yield* client.insert(Waiter, { n: 1 })
          yield* idsOf(job.id, 1)
          yield* client.storage.cancelJob(job.id, "no longer needed")
          yield* Deferred.await(interrupted)
          assert.strictEqual((yield* stateOf(job.id)).state, "cancelled")
        }).pipe(
          Effect.provide(
            Awa.worker({
              queues: { cb_cancel: { maxConcurrency: 1 } },
              handlers: [
                handler(Waiter, (_args, ctx) =>
                  Effect.gen(function* () {
                    const token = yield* ctx.registerCallback({ timeout: "1 hour" })
                    sendOut(ctx.job.id, token.id)
                    yield* ctx.waitForCallback(token)
                  }).pipe(Effect.onInterrupt(() => Deferred.succeed(interrupted, undefined)))
                )
              ],
              maintenance: fastMaintenance
            })
          )
        )
      }).pipe(Effect.provide(AwaLive)),
    60_000
  )
})
