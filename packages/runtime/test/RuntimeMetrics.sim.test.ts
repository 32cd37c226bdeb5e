/**
 * The runtime's instruments (RuntimeMetrics.ts) move with the events they count: enqueues,
 * claims, each applied outcome, handler durations, pickup latency, the leader's rescues and
 * prunes and its leadership. On the simulation layer with virtual time; each test reads its own
 * metric registry.
 */
import { Job } from "@awa/core"
import { QueueStorage } from "@awa/storage"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Exit, Layer, Metric, Schema, Scope } from "effect"
import * as Awa from "../src/Awa.ts"
import { AwaClient } from "../src/AwaClient.ts"
import { handler } from "../src/Handler.ts"
import * as RuntimeMetrics from "../src/RuntimeMetrics.ts"
import { advance } from "./support.ts"

const Task = Job.define({ kind: "task", args: Schema.Struct({ n: Schema.Number }), queue: "metrics" })

const byTask = { "awa.queue": "metrics", "awa.job.kind": "task" }
const count = (
  metric: Metric.Metric<number, Metric.CounterState<number>>,
  attributes: Record<string, string> = byTask
) => Effect.map(Metric.value(metric.pipe(Metric.withAttributes(attributes))), (s) => s.count)
const observations = (metric: Metric.Metric<number, Metric.HistogramState>) =>
  Effect.map(Metric.value(metric.pipe(Metric.withAttributes(byTask))), (s) => s.count)

/** A registry of the test's own (layers built inside it record there), so counts start at zero. */
const ownRegistry = <A, E, R>(effect: Effect.Effect<A, E, R>) =>
  Effect.provideService(effect, Metric.MetricRegistry, new Map())

describe("runtime metrics", () => {
  it.effect("enqueued, claimed, completed, retried, failed and cancelled move with their events", () =>
    Effect.gen(function* () {
      const scope = yield* Scope.make()
      yield* Layer.buildWithScope(
        Awa.worker({
          queues: { metrics: { pollInterval: "50 millis" } },
          handlers: [
            handler(
              Task,
              ({ n }): Effect.Effect<void | Job.JobResult, Job.JobRetryableError | Job.JobTerminalError> =>
                n === 1
                  ? Effect.void
                  : n === 2
                    ? Effect.fail(new Job.JobRetryableError({ message: "again" }))
                    : n === 3
                      ? Effect.fail(new Job.JobTerminalError({ message: "never" }))
                      : Effect.succeed(Job.JobResult.cancel("not needed"))
            )
          ],
          maintenance: { electionInterval: "100 millis", promoteInterval: "100 millis" }
        }),
        scope
      )
      const client = yield* AwaClient
      yield* client.insertMany(Task, [{ n: 1 }, { n: 2 }, { n: 3 }, { n: 4 }], { maxAttempts: 5 })
      assert.strictEqual(yield* count(RuntimeMetrics.jobsEnqueued), 4)
      yield* advance(1_000)
      assert.strictEqual(yield* count(RuntimeMetrics.jobsClaimed), 4)
      assert.strictEqual(yield* count(RuntimeMetrics.jobsCompleted), 1)
      assert.strictEqual(yield* count(RuntimeMetrics.jobsRetried), 1)
      assert.strictEqual(yield* count(RuntimeMetrics.jobsFailed), 1)
      assert.strictEqual(yield* count(RuntimeMetrics.jobsCancelled), 1)
      assert.strictEqual(yield* observations(RuntimeMetrics.handlerDuration), 4)
      assert.strictEqual(yield* observations(RuntimeMetrics.pickupLatency), 4)
      // the retried job runs again after its backoff (2 s + jitter): claimed once more
      yield* advance(4_000, 50)
      assert.strictEqual(yield* count(RuntimeMetrics.jobsClaimed), 5)
      assert.strictEqual(yield* count(RuntimeMetrics.jobsRetried), 2)
      // the leader: elected, and its rotate-prune duty has tried to prune
      const noopPrunes = yield* count(RuntimeMetrics.prunes, { outcome: "noop", reason: "" })
      assert.isAbove(noopPrunes, 0, "each rotate-prune tick tried to prune")
      const leader = yield* Metric.value(RuntimeMetrics.isLeader)
      assert.strictEqual(leader.value, 1)
      yield* Scope.close(scope, Exit.void)
      assert.strictEqual(
        (yield* Metric.value(RuntimeMetrics.isLeader)).value,
        0,
        "leadership ended with the worker"
      )
    }).pipe(Effect.provide(Awa.layerSim()), ownRegistry)
  )

  it.effect("the leader's deadline rescue is counted by reason, queue and kind", () =>
    Effect.gen(function* () {
      const client = yield* AwaClient
      const storage = yield* QueueStorage
      yield* client.insert(Task, { n: 1 })
      // claimed by a process that then vanished: no worker of this test holds it
      const [claimed] = yield* storage.claim({
        queue: "metrics",
        max: 1,
        deadlineMs: 500,
        agingIntervalMs: 0
      })
      assert.isDefined(claimed)
      const scope = yield* Scope.make()
      yield* Layer.buildWithScope(
        Awa.worker({
          queues: { other: {} },
          handlers: [handler(Task, (): Effect.Effect<void> => Effect.void)],
          maintenance: { electionInterval: "100 millis", rescueInterval: "200 millis" }
        }),
        scope
      )
      yield* advance(2_000, 50)
      const rescued = yield* count(RuntimeMetrics.jobsRescued, { reason: "deadline_exceeded", ...byTask })
      assert.strictEqual(rescued, 1)
      yield* Scope.close(scope, Exit.void)
    }).pipe(Effect.provide(Awa.layerSim()), ownRegistry)
  )
})
