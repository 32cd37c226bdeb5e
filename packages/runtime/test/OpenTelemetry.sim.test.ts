/**
 * Traces and metrics reach the OpenTelemetry SDK through `@effect/opentelemetry` (issue 18 item
 * 4): the SDK's in-memory exporters see the producer and consumer spans of a job (parent and
 * child, one trace) and the runtime's counters and histograms with their attributes. On the
 * simulation layer; the OpenTelemetry packages are dev dependencies here, the application
 * installs them (docs/guide.md, "Metrics").
 */
import { Job } from "@awa/core"
import * as OtelMetrics from "@effect/opentelemetry/OtelMetrics"
import * as OtelTracer from "@effect/opentelemetry/OtelTracer"
import * as Resource from "@effect/opentelemetry/Resource"
import { assert, describe, it } from "@effect/vitest"
import {
  AggregationTemporality,
  InMemoryMetricExporter,
  PeriodicExportingMetricReader
} from "@opentelemetry/sdk-metrics"
import { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor } from "@opentelemetry/sdk-trace-base"
import { Effect, Exit, Layer, Metric, Schema, Scope } from "effect"
import * as Awa from "../src/Awa.ts"
import { AwaClient } from "../src/AwaClient.ts"
import { handler } from "../src/Handler.ts"
import { advance } from "./support.ts"

const Task = Job.define({ kind: "task", args: Schema.Struct({ n: Schema.Number }), queue: "otel" })

describe("OpenTelemetry export", () => {
  it.effect("the SDK's in-memory exporters receive the job's spans and the runtime's metrics", () => {
    const spans = new InMemorySpanExporter()
    const metrics = new InMemoryMetricExporter(AggregationTemporality.CUMULATIVE)
    // exports on forceFlush only (the interval is never reached under the test clock)
    const reader = new PeriodicExportingMetricReader({ exporter: metrics, exportIntervalMillis: 3_600_000 })
    // what NodeSdk.layer assembles, without the logs SDK and the Node tracer provider
    const Otel = Layer.mergeAll(
      OtelTracer.layer.pipe(
        Layer.provide(
          Layer.succeed(
            OtelTracer.OtelTracerProvider,
            new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(spans)] })
          )
        )
      ),
      OtelMetrics.layer(() => reader)
    ).pipe(Layer.provide(Resource.layer({ serviceName: "awa-test" })))
    return Effect.gen(function* () {
      const scope = yield* Scope.make()
      yield* Layer.buildWithScope(
        Awa.worker({
          queues: { otel: { pollInterval: "50 millis" } },
          handlers: [handler(Task, (): Effect.Effect<void> => Effect.void)],
          maintenance: false
        }),
        scope
      )
      const client = yield* AwaClient
      yield* client.insert(Task, { n: 1 }).pipe(Effect.withSpan("checkout"))
      yield* advance(500)
      yield* Scope.close(scope, Exit.void)

      const finished = spans.getFinishedSpans()
      const producer = finished.find((s) => s.name === "send task")
      const consumer = finished.find((s) => s.name === "process task")
      assert.isDefined(producer, `spans: ${finished.map((s) => s.name).join(", ")}`)
      assert.isDefined(consumer)
      assert.strictEqual(consumer!.spanContext().traceId, producer!.spanContext().traceId, "one trace")
      assert.strictEqual(consumer!.parentSpanContext?.spanId, producer!.spanContext().spanId)

      yield* Effect.promise(() => reader.forceFlush())
      const exported = metrics.getMetrics().flatMap((r) => r.scopeMetrics.flatMap((s) => s.metrics))
      const named = (name: string) => exported.filter((m) => m.descriptor.name === name).at(-1)
      for (const name of ["awa.job.enqueued", "awa.job.claimed", "awa.job.completed"]) {
        const metric = named(name)
        assert.isDefined(
          metric,
          `${name} exported (have: ${[...new Set(exported.map((m) => m.descriptor.name))].join(", ")})`
        )
        const point = metric!.dataPoints.find((p) => p.attributes["awa.queue"] === "otel")
        assert.isDefined(point, `${name} has a point for queue otel`)
        assert.strictEqual(point!.value, 1, name)
        assert.strictEqual(point!.attributes["awa.job.kind"], "task")
      }
      const duration = named("awa.job.handler_duration_seconds")
      assert.isDefined(duration)
      const histogram = duration!.dataPoints.find((p) => p.attributes["awa.queue"] === "otel")!.value as {
        readonly count: number
      }
      assert.strictEqual(histogram.count, 1)
    }).pipe(
      Effect.provide(Layer.mergeAll(Awa.layerSim(), Otel)),
      Effect.provideService(Metric.MetricRegistry, new Map())
    )
  })
})
