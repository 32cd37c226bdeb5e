/**
 * Jobs of a kind this worker has no handler for (capabilities.md §3), on Postgres: by default
 * they are retried with backoff, so a rolling deploy (old workers without the kind, new ones with
 * it, on one queue) fails none of them; `onUnknownKind: "retry"` and `"fail"` do what they say.
 */
import { Job } from "@awa/core"
import { TestDatabase } from "@awa/testing"
import { PgClient } from "@effect/sql-pg"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Exit, Layer, Redacted, Schema, Scope } from "effect"
import * as Awa from "../src/Awa.ts"
import { AwaClient } from "../src/AwaClient.ts"
import { handler } from "../src/Handler.ts"
import type { WorkerOptions } from "../src/Worker.ts"
import { eventually } from "./support.ts"

const Old = Job.define({ kind: "known_to_all", args: Schema.Struct({ n: Schema.Number }), queue: "deploy" })
const New = Job.define({ kind: "added_in_v2", args: Schema.Struct({ n: Schema.Number }), queue: "deploy" })

const awaOn = (url: string) =>
  Awa.layerPg().pipe(Layer.provideMerge(PgClient.layer({ url: Redacted.make(url), maxConnections: 6 })))

/** A worker on its own pool, in a scope the test closes. */
const startWorker = <R>(url: string, options: WorkerOptions<R>) =>
  Effect.gen(function* () {
    // closed by the test's scope too, so a failing test does not leave the worker running
    const scope = yield* Effect.acquireRelease(Scope.make(), (s) => Scope.close(s, Exit.void))
    yield* Layer.buildWithScope(Awa.worker(options).pipe(Layer.provideMerge(awaOn(url))), scope)
    return Scope.close(scope, Exit.void)
  })

const withDatabase = <A, E, R>(body: (url: string) => Effect.Effect<A, E, R>) =>
  Effect.flatMap(TestDatabase.acquire(), ({ url }) => body(url))

const queues = { deploy: { pollInterval: "50 millis" } } as const
const maintenance = { electionInterval: "100 millis", promoteInterval: "50 millis" } as const

const unknownErrors = (errors: ReadonlyArray<{ readonly error: string }>) =>
  errors.filter((e) => e.error === `unknown job kind: ${New.kind}`).length

describe("unknown kinds on Postgres", () => {
  it.live(
    "a two-version rolling deploy on one queue fails no job of the new kind",
    () =>
      withDatabase((url) =>
        Effect.gen(function* () {
          const ran: Array<number> = []
          const v1: WorkerOptions<never> = {
            queues,
            handlers: [handler(Old, () => Effect.void)],
            maintenance
          }
          const v2: WorkerOptions<never> = {
            queues,
            handlers: [
              handler(Old, () => Effect.void),
              handler(New, ({ n }) => Effect.sync(() => void ran.push(n)))
            ],
            maintenance
          }
          const client = yield* AwaClient
          const stopV1 = yield* startWorker(url, v1)
          // producers already upgraded: jobs of the new kind arrive while only v1 runs
          const jobs = yield* client.insertMany(
            New,
            Array.from({ length: 5 }, (_, n) => ({ n }))
          )
          yield* eventually(
            Effect.map(
              Effect.forEach(jobs, (j) => client.storage.getJob(j.id)),
              (views) => views.every((v) => unknownErrors(v.errors) >= 1)
            ),
            30_000,
            "v1 claimed every job of the new kind"
          )
          // the deploy: v2 starts, then v1 stops
          const stopV2 = yield* startWorker(url, v2)
          yield* stopV1
          yield* eventually(
            Effect.map(
              Effect.forEach(jobs, (j) => client.storage.getJob(j.id)),
              (views) => views.every((v) => v.state === "completed")
            ),
            30_000,
            "v2 completed them"
          )
          assert.deepStrictEqual(
            [...ran].sort((a, b) => a - b),
            [0, 1, 2, 3, 4]
          )
          const counts = yield* client.storage.countByQueueState
          assert.deepStrictEqual(counts, [{ queue: "deploy", state: "completed", count: 5 }])
          yield* stopV2
        }).pipe(Effect.provide(awaOn(url)))
      ),
    90_000
  )

  it.live(
    'onUnknownKind "retry" records a retryable error with backoff and fails only when attempts run out',
    () =>
      withDatabase((url) =>
        Effect.gen(function* () {
          const client = yield* AwaClient
          const stop = yield* startWorker(url, {
            queues,
            handlers: [handler(Old, () => Effect.void)],
            onUnknownKind: "retry",
            maintenance
          })
          const job = yield* client.insert(New, { n: 1 }, { maxAttempts: 2 })
          yield* eventually(
            Effect.map(client.storage.getJob(job.id), (v) => v.errors.length >= 1),
            30_000,
            "the first attempt"
          )
          const first = yield* client.storage.getJob(job.id)
          assert.deepStrictEqual(
            [first.state, first.attempt, first.errors.map((e) => [e.error, e.terminal])],
            ["retryable", 1, [[`unknown job kind: ${New.kind}`, undefined]]]
          )
          // the default backoff of attempt 1 is 2–2.5 s
          assert.isAtLeast(first.runAt.getTime() - new Date(first.errors[0]!.at).getTime(), 2000)
          yield* eventually(
            Effect.map(client.storage.getJob(job.id), (v) => v.state === "failed"),
            30_000,
            "the second attempt exhausts it"
          )
          const last = yield* client.storage.getJob(job.id)
          assert.deepStrictEqual(
            last.errors.map((e) => [e.attempt, e.terminal]),
            [
              [1, undefined],
              [2, true]
            ]
          )
          yield* stop
        }).pipe(Effect.provide(awaOn(url)))
      ),
    90_000
  )

  it.live('onUnknownKind "fail" fails the job terminally at once', () =>
    withDatabase((url) =>
      Effect.gen(function* () {
        const client = yield* AwaClient
        const stop = yield* startWorker(url, {
          queues,
          handlers: [handler(Old, () => Effect.void)],
          onUnknownKind: "fail",
          maintenance
        })
        const job = yield* client.insert(New, { n: 1 })
        yield* eventually(
          Effect.map(client.storage.getJob(job.id), (v) => v.state === "failed"),
          30_000,
          "failed"
        )
        const view = yield* client.storage.getJob(job.id)
        assert.deepStrictEqual(
          [view.attempt, view.errors.map((e) => [e.error, e.terminal])],
          [1, [[`unknown job kind: ${New.kind}`, true]]]
        )
        yield* stop
      }).pipe(Effect.provide(awaOn(url)))
    )
  )
})
