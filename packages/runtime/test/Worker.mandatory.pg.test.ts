/**
 * Behaviour the spec names as mandatory tests, end to end on Postgres: a low-priority job is not
 * starved by a steady stream of high-priority work (capabilities.md §5), and five failing
 * attempts are spaced by the default backoff (§3).
 */
import { Backoff, Job } from "@awa/core"
import { TestDatabase } from "@awa/testing"
import { PgClient } from "@effect/sql-pg"
import { assert, describe, it } from "@effect/vitest"
import { Clock, Deferred, Effect, Exit, Fiber, Layer, Redacted, Schema, Scope } from "effect"
import * as Awa from "../src/Awa.ts"
import { AwaClient } from "../src/AwaClient.ts"
import { handler } from "../src/Handler.ts"
import type { WorkerOptions } from "../src/Worker.ts"
import { eventually } from "./support.ts"

const Urgent = Job.define({ kind: "urgent", args: Schema.Struct({ n: Schema.Number }), queue: "starve" })
const Report = Job.define({ kind: "report", args: Schema.Struct({}), queue: "starve" })
const Flaky = Job.define({ kind: "flaky", args: Schema.Struct({}), queue: "flaky" })

const withAwa = <A, E>(
  body: Effect.Effect<A, E, Layer.Success<ReturnType<typeof Awa.layerPg>> | Scope.Scope>
) =>
  Effect.flatMap(TestDatabase.acquire(), ({ url }) =>
    body.pipe(
      // the body's scope (its workers) closes before the pool: a failing test stops its worker
      // instead of leaving it claiming on a closed pool until the test's timeout
      Effect.scoped,
      Effect.provide(
        Awa.layerPg().pipe(Layer.provideMerge(PgClient.layer({ url: Redacted.make(url), maxConnections: 6 })))
      )
    )
  )

/** Builds a worker on the ambient Awa services; returns how to stop it. */
const startWorker = <R>(options: WorkerOptions<R>) =>
  Effect.gen(function* () {
    // closed by the test's scope too, so a failing test does not leave the worker running
    const scope = yield* Effect.acquireRelease(Scope.make(), (s) => Scope.close(s, Exit.void))
    yield* Layer.buildWithScope(Awa.worker(options), scope)
    return Scope.close(scope, Exit.void)
  })

describe("mandatory end-to-end behaviour on Postgres", () => {
  it.live(
    "a priority-4 job overtakes a steady stream of priority-1 work once aged (3 intervals)",
    () =>
      withAwa(
        Effect.gen(function* () {
          const client = yield* AwaClient
          let inserted = 0
          let completed = 0
          // when the priority-4 job started, and how much priority-1 work was then not yet done
          const ran = yield* Deferred.make<{ readonly startedAt: number; readonly waiting: number }>()
          const stop = yield* startWorker({
            queues: {
              starve: {
                maxConcurrency: 2,
                prefetch: 0,
                pollInterval: "20 millis",
                priorityAgingInterval: "1 second"
              }
            },
            handlers: [
              handler(Urgent, () =>
                Effect.sleep("10 millis").pipe(
                  Effect.andThen(
                    Effect.sync(() => {
                      completed++
                    })
                  )
                )
              ),
              handler(Report, () =>
                Effect.flatMap(Clock.currentTimeMillis, (startedAt) =>
                  // at most maxConcurrency (2) of the not-yet-completed are running
                  Deferred.succeed(ran, { startedAt, waiting: inserted - completed - 2 })
                ).pipe(Effect.asVoid)
              )
            ],
            maintenance: false
          })
          // The stream: priority-1 work kept at 300–400 waiting jobs (about two seconds of work),
          // so there always is some, and its oldest is younger than three aging intervals.
          const stream = yield* Effect.gen(function* () {
            for (;;) {
              if (inserted - completed < 300) {
                yield* client.insertMany(
                  Urgent,
                  Array.from({ length: 100 }, (_, k) => ({ n: inserted + k })),
                  { priority: 1 }
                )
                inserted += 100
              }
              // pacing the load generator, not waiting for a condition
              yield* Effect.sleep("5 millis")
            }
          }).pipe(Effect.forkChild)
          yield* eventually(
            Effect.sync(() => completed >= 50),
            30_000,
            "the stream is flowing"
          )
          // Before the insert: the span from here to the handler's start holds the span the
          // database measured, from the job's run_at to the claim (a span: any clock offset cancels).
          const insertedAt = yield* Clock.currentTimeMillis
          yield* client.insert(Report, {}, { priority: 4 })
          // Without aging it would wait for the stream to stop; with it, it runs while it flows.
          const at = yield* Deferred.await(ran).pipe(
            Effect.timeoutOrElse({
              duration: "60 seconds",
              orElse: () => Effect.die(new Error("the priority-4 job starved"))
            })
          )
          // It ran because it aged, not because the stream ran dry or priority was ignored: it
          // waited the three intervals that take priority 4 to 1 (tied with the stream, the
          // older head goes first), and priority-1 work was still waiting when it was claimed.
          // (10 ms of slack for millisecond rounding)
          assert.isAtLeast(at.startedAt - insertedAt, 2_990, "claimed only once aged three intervals")
          assert.isAtLeast(at.waiting, 100, "priority-1 work was waiting when it was claimed")
          yield* Fiber.interrupt(stream)
          yield* stop
        })
      ),
    120_000
  )

  it.live(
    "five failing attempts: five error entries, each retry due within the default backoff bounds, then failed",
    () =>
      withAwa(
        Effect.gen(function* () {
          const client = yield* AwaClient
          // the job as each attempt sees it: its due time (runAt) and the errors so far
          const seen: Array<{
            readonly attempt: number
            readonly runAt: number
            readonly startedAt: number
          }> = []
          const stop = yield* startWorker({
            queues: { flaky: { pollInterval: "50 millis" } },
            handlers: [
              handler(Flaky, (_args, ctx) =>
                Effect.gen(function* () {
                  const view = yield* client.storage.getJob(ctx.job.id)
                  seen.push({
                    attempt: ctx.job.attempt,
                    runAt: view.runAt.getTime(),
                    startedAt: yield* Clock.currentTimeMillis
                  })
                  return yield* Effect.fail(
                    new Job.JobRetryableError({ message: `failure ${ctx.job.attempt}` })
                  )
                })
              )
            ],
            maintenance: { promoteInterval: "50 millis", electionInterval: "100 millis" }
          })
          const job = yield* client.insert(Flaky, {}, { maxAttempts: 5 })
          yield* eventually(
            Effect.map(client.storage.getJob(job.id), (v) => v.state === "failed"),
            100_000,
            "failed after five attempts"
          )
          const view = yield* client.storage.getJob(job.id)
          assert.deepStrictEqual(
            view.errors.map((e) => [e.attempt, e.terminal]),
            [
              [1, undefined],
              [2, undefined],
              [3, undefined],
              [4, undefined],
              [5, true]
            ]
          )
          assert.deepStrictEqual(
            seen.map((s) => s.attempt),
            [1, 2, 3, 4, 5]
          )
          for (let n = 1; n <= 4; n++) {
            // the database's own times: when attempt n failed, and when attempt n + 1 was due
            const failedAt = new Date(view.errors[n - 1]!.at).getTime()
            const delay = seen[n]!.runAt - failedAt
            const { min, max } = Backoff.backoffBounds(n)
            assert.isAtLeast(delay, min, `retry ${n} due after at least ${min} ms`)
            assert.isAtMost(delay, max, `retry ${n} due after at most ${max} ms`)
            assert.isAtLeast(
              seen[n]!.startedAt,
              seen[n]!.runAt - 1000,
              `attempt ${n + 1} did not start early`
            )
          }
          yield* stop
        })
      ),
    150_000
  )
})
