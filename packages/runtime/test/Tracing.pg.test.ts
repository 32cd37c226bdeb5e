import { Job, Traceparent } from "@awa/core"
import { TestDatabase } from "@awa/testing"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Layer, Option, Schema } from "effect"
import * as Awa from "../src/Awa.ts"
import { AwaClient } from "../src/AwaClient.ts"
import { handler } from "../src/Handler.ts"
import { eventually, recordingTracer } from "./support.ts"

const Traced = Job.define({
  kind: "traced",
  args: Schema.Struct({ n: Schema.Number }),
  queue: "traces",
  backoff: () => 0
})

const AwaLive = Awa.layerPg().pipe(Layer.provideMerge(TestDatabase.layer()))

describe("trace propagation", () => {
  it.live(
    "the producer span's context reaches the first attempt as parent and later attempts as a link",
    () => {
      const { spans, tracer } = recordingTracer()
      return Effect.gen(function* () {
        const client = yield* AwaClient
        const job = yield* client.insert(Traced, { n: 1 }).pipe(Effect.withSpan("checkout"))
        const stored = (yield* client.storage.getJob(job.id)).metadata[Traceparent.metadataKey]
        const producer = spans.find((s) => s.name === "send traced")!
        assert.isDefined(producer)
        assert.strictEqual(
          stored,
          Traceparent.encode({ traceId: producer.traceId, spanId: producer.spanId, sampled: true })
        )
        yield* Effect.gen(function* () {
          yield* eventually(
            Effect.map(client.storage.getJob(job.id), (j) => j.state === "completed"),
            10_000,
            "completed"
          )
        }).pipe(
          Effect.provide(
            Awa.worker({
              queues: { traces: {} },
              handlers: [
                handler(Traced, (_args, ctx) =>
                  ctx.job.attempt === 1
                    ? Effect.fail(new Job.JobRetryableError({ message: "once more" }))
                    : Effect.void
                )
              ],
              maintenance: { promoteInterval: "20 millis", electionInterval: "50 millis" }
            })
          ),
          Effect.scoped
        )
        const processes = spans.filter((s) => s.name === "process traced")
        assert.strictEqual(processes.length, 2)
        const [first, second] = processes
        const firstParent = Option.getOrUndefined(first!.parent)
        assert.strictEqual(firstParent?.spanId, producer.spanId)
        assert.strictEqual(first!.traceId, producer.traceId)
        assert.strictEqual(first!.kind, "consumer")
        assert.notStrictEqual(second!.traceId, producer.traceId, "a retry starts a new trace")
        assert.deepStrictEqual(
          second!.links.map((l) => l.span.spanId),
          [producer.spanId]
        )
        assert.strictEqual(first!.attributes.get("messaging.destination.name"), "traces")
      }).pipe(Effect.provide(AwaLive), Effect.withTracer(tracer))
    }
  )

  it.live("with tracing off, nothing is stored", () =>
    Effect.gen(function* () {
      const client = yield* AwaClient
      const job = yield* client.insert(Traced, { n: 2 }).pipe(Effect.withSpan("checkout"))
      assert.isUndefined((yield* client.storage.getJob(job.id)).metadata[Traceparent.metadataKey])
    }).pipe(Effect.provide(Awa.layerPg({ tracing: false }).pipe(Layer.provideMerge(TestDatabase.layer()))))
  )

  it.live("a client with tracing off opens no producer span; with tracing on, one per call", () => {
    const { spans, tracer } = recordingTracer()
    const layerWith = (tracing: boolean) =>
      Awa.layerPg({ tracing }).pipe(Layer.provideMerge(TestDatabase.layer()))
    const insertBoth = Effect.gen(function* () {
      const client = yield* AwaClient
      yield* client.insert(Traced, { n: 4 })
      yield* client.insertMany(Traced, [{ n: 5 }, { n: 6 }])
    })
    return Effect.gen(function* () {
      yield* insertBoth.pipe(Effect.provide(layerWith(false)))
      assert.deepStrictEqual(
        spans.filter((s) => s.name.startsWith("send ")),
        []
      )
      yield* insertBoth.pipe(Effect.provide(layerWith(true)))
      assert.deepStrictEqual(
        spans.filter((s) => s.name.startsWith("send ")).map((s) => s.kind),
        ["producer", "producer"]
      )
    }).pipe(Effect.withTracer(tracer))
  })

  it.live("a worker with tracing off opens no span per attempt", () => {
    const { spans, tracer } = recordingTracer()
    return Effect.gen(function* () {
      const client = yield* AwaClient
      const job = yield* client.insert(Traced, { n: 3 })
      yield* eventually(
        Effect.map(client.storage.getJob(job.id), (j) => j.state === "completed"),
        10_000,
        "completed"
      ).pipe(
        Effect.provide(
          Awa.worker({
            queues: { traces: {} },
            handlers: [handler(Traced, () => Effect.void)],
            tracing: false,
            maintenance: false
          })
        ),
        Effect.scoped
      )
      assert.deepStrictEqual(
        spans.filter((s) => s.name.startsWith("process ")),
        []
      )
    }).pipe(Effect.provide(AwaLive), Effect.withTracer(tracer))
  })
})
