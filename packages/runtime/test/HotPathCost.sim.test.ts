/**
 * What the per-job cost cuts of issue 17 (ADR 0031) keep and what they drop, on the simulation
 * layer with virtual time:
 * - Under Effect's default tracer (no tracer installed) an attempt of a job inserted inside a span
 *   still runs in its consumer span, child of that span (a handler or logger reads the trace id
 *   from `Effect.currentSpan`), but the span carries no attributes: only an installed tracer could
 *   export them (Tracing.pg.test.ts checks them with one installed).
 * - Under it, an insert outside any span opens none and stores no traceparent, and its attempt
 *   runs in no span (ADR 0043); with a tracer installed the insert opens its `send` span and the
 *   attempt its child, as before.
 * - No fiber waits for an attempt's acknowledgement any more (the batcher calls back), yet the
 *   attempt stays in the running registry, heartbeated, until its outcome is durable.
 * - The runtime's metrics, now tagged through one context per (queue, kind), still carry the
 *   metric attributes of the context the worker was built in, next to queue and kind.
 */
import { Job, Traceparent, ValidationError } from "@awa/core"
import { QueueStorage } from "@awa/storage"
import { assert, describe, it } from "@effect/vitest"
import {
  Clock,
  Context,
  Deferred,
  Effect,
  Exit,
  Layer,
  Metric,
  Option,
  Schema,
  Scope,
  type Tracer
} from "effect"
import * as Awa from "../src/Awa.ts"
import { AwaClient } from "../src/AwaClient.ts"
import { handler } from "../src/Handler.ts"
import * as RuntimeMetrics from "../src/RuntimeMetrics.ts"
import { Worker } from "../src/Worker.ts"
import { advance, recordingTracer } from "./support.ts"

const Task = Job.define({ kind: "task", args: Schema.Struct({ n: Schema.Number }), queue: "hot" })

describe("per-job cost cuts keep what a user can see", () => {
  /** Inserts one job with `insert`, runs it, and answers its stored traceparent and the span its handler ran in. */
  const spanOfOneAttempt = (
    insert: (client: AwaClient["Service"]) => Effect.Effect<{ readonly id: bigint }, unknown>
  ) =>
    Effect.gen(function* () {
      const seen: Array<Option.Option<Tracer.Span>> = []
      const scope = yield* Scope.make()
      yield* Layer.buildWithScope(
        Awa.worker({
          queues: { hot: { pollInterval: "50 millis" } },
          handlers: [
            handler(Task, () => Effect.map(Effect.option(Effect.currentSpan), (span) => void seen.push(span)))
          ]
        }),
        scope
      )
      const client = yield* AwaClient
      const job = yield* insert(client)
      const stored = (yield* client.storage.getJob(job.id)).metadata[Traceparent.metadataKey]
      yield* advance(1_000)
      yield* Scope.close(scope, Exit.void)
      assert.strictEqual(seen.length, 1)
      return { stored, span: Option.getOrUndefined(seen[0]!) }
    })

  it.effect(
    "under the default tracer the attempt's span has the caller's span as parent and no attributes",
    () =>
      Effect.gen(function* () {
        let caller: Tracer.Span | undefined
        const { stored, span } = yield* spanOfOneAttempt((client) =>
          Effect.flatMap(Effect.currentSpan, (current) => {
            caller = current
            return client.insert(Task, { n: 1 })
          }).pipe(Effect.withSpan("checkout"))
        )
        assert.strictEqual(
          stored,
          Traceparent.encode({ traceId: caller!.traceId, spanId: caller!.spanId, sampled: caller!.sampled }),
          "the caller's span, not a producer span of the insert's own"
        )
        assert.isDefined(span)
        assert.strictEqual(span!.name, "process task")
        assert.strictEqual(span!.kind, "consumer")
        assert.strictEqual(span!.traceId, caller!.traceId)
        assert.strictEqual(Option.getOrUndefined(span!.parent)?.spanId, caller!.spanId)
        assert.strictEqual(span!.attributes.size, 0, "no attributes for a tracer that exports nothing")
      }).pipe(Effect.provide(Awa.layerSim()))
  )

  it.effect(
    "under the default tracer an insert outside any span stores no traceparent and its attempt runs in no span",
    () =>
      Effect.gen(function* () {
        const { stored, span } = yield* spanOfOneAttempt((client) => client.insert(Task, { n: 1 }))
        assert.isUndefined(stored, "no trace id that no backend has")
        assert.isUndefined(span, "no span for a tracer that exports nothing and a job with no trace")
      }).pipe(Effect.provide(Awa.layerSim()))
  )

  it.effect(
    "with a tracer installed an insert outside any span opens its producer span, the attempt its child",
    () => {
      const { spans, tracer } = recordingTracer()
      return Effect.gen(function* () {
        const { stored, span } = yield* spanOfOneAttempt((client) => client.insert(Task, { n: 1 }))
        const producer = spans.find((s) => s.name === "send task")
        assert.isDefined(producer)
        assert.strictEqual(
          stored,
          Traceparent.encode({ traceId: producer!.traceId, spanId: producer!.spanId, sampled: true })
        )
        assert.strictEqual(span?.name, "process task")
        assert.strictEqual(Option.getOrUndefined(span!.parent)?.spanId, producer!.spanId)
        assert.strictEqual(span!.attributes.get("messaging.destination.name"), "hot")
      }).pipe(Effect.provide(Awa.layerSim()), Effect.withTracer(tracer))
    }
  )

  it.effect(
    "an insert's delay is read from the clock and a bad one is a ValidationError, with or without a span",
    () =>
      Effect.gen(function* () {
        const client = yield* AwaClient
        const now = yield* Clock.currentTimeMillis
        const delayed = yield* client
          .insert(Task, { n: 1 }, { delay: "5 seconds" })
          .pipe(Effect.withSpan("checkout"))
        const stored = yield* client.storage.getJob(delayed.id)
        assert.strictEqual(stored.runAt.getTime(), now + 5_000)
        assert.isDefined(
          Traceparent.decode(stored.metadata[Traceparent.metadataKey]),
          "the caller's span, with a delay"
        )
        const bad = yield* Effect.flip(client.insert(Task, { n: 2 }, { delay: "soon" as never }))
        assert.instanceOf(bad, ValidationError)
        assert.strictEqual((bad as ValidationError).field, "delay")
        assert.strictEqual(
          (yield* client.storage.listJobs({ queue: "hot" })).length,
          1,
          "nothing written for bad input"
        )
      }).pipe(Effect.provide(Awa.layerSim()))
  )

  it.effect("the worker's metrics keep the metric attributes of the context it was built in", () =>
    Effect.gen(function* () {
      const scope = yield* Scope.make()
      yield* Layer.buildWithScope(
        Awa.worker({
          queues: { hot: { pollInterval: "50 millis" } },
          handlers: [handler(Task, () => Effect.void)]
        }),
        scope
      )
      const client = yield* AwaClient
      yield* client.insertMany(Task, [{ n: 1 }, { n: 2 }])
      yield* advance(1_000)
      yield* Scope.close(scope, Exit.void)
      const completed = yield* Metric.value(
        RuntimeMetrics.jobsCompleted.pipe(
          Metric.withAttributes({ service: "billing", "awa.queue": "hot", "awa.job.kind": "task" })
        )
      )
      assert.strictEqual(completed.count, 2)
      const claimed = yield* Metric.value(
        RuntimeMetrics.jobsClaimed.pipe(
          Metric.withAttributes({ service: "billing", "awa.queue": "hot", "awa.job.kind": "task" })
        )
      )
      assert.strictEqual(claimed.count, 2)
    }).pipe(
      Effect.provide(Awa.layerSim()),
      Effect.provideService(Metric.MetricRegistry, new Map()),
      Effect.provideService(Metric.CurrentMetricAttributes, { service: "billing" })
    )
  )

  it.effect("an attempt stays in the running registry until its batch's finalize call has returned", () =>
    Effect.gen(function* () {
      // finalize calls wait for the gate: the outcome is submitted but not yet durable
      const flushing = yield* Deferred.make<void>()
      const gate = yield* Deferred.make<void>()
      const gated = Layer.effect(
        QueueStorage,
        Effect.map(Effect.service(QueueStorage), (storage) =>
          QueueStorage.of({
            ...storage,
            finalizeMany: (items) =>
              Deferred.succeed(flushing, undefined).pipe(
                Effect.andThen(Deferred.await(gate)),
                Effect.andThen(storage.finalizeMany(items))
              )
          })
        )
      )
      const handled = yield* Deferred.make<void>()
      const scope = yield* Scope.make()
      const context = yield* Layer.buildWithScope(
        Awa.worker({
          queues: { hot: { pollInterval: "50 millis" } },
          handlers: [handler(Task, () => Effect.asVoid(Deferred.succeed(handled, undefined)))],
          maintenance: false
        }).pipe(Layer.provide(gated)),
        scope
      )
      const worker = Context.get(context, Worker)
      const client = yield* AwaClient
      const job = yield* client.insert(Task, { n: 1 })
      yield* advance(100)
      yield* Deferred.await(handled)
      yield* Deferred.await(flushing)
      yield* advance(100)
      assert.strictEqual(yield* worker.running, 1, "heartbeated until its outcome is durable")
      assert.strictEqual((yield* client.storage.getJob(job.id)).state, "running")
      yield* Deferred.succeed(gate, undefined)
      yield* advance(100)
      assert.strictEqual(yield* worker.running, 0, "forgotten once the call returned")
      assert.strictEqual((yield* client.storage.getJob(job.id)).state, "completed")
      yield* Scope.close(scope, Exit.void)
    }).pipe(Effect.provide(Awa.layerSim()))
  )
})
