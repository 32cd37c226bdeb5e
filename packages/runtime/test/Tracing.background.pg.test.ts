/**
 * Tracing beyond job spans (capabilities.md §26): a caller's `awa:traceparent` wins over the
 * current span and a malformed one is rejected at insert; the worker's background loops (claim
 * polls, leader election, maintenance duties, completion flushes) emit no spans by default, and
 * with `backgroundSpans` one span per tick with the queries under it.
 */
import { Job, Traceparent, ValidationError } from "@awa/core"
import { TestDatabase } from "@awa/testing"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Layer, Option, Schema, type Tracer } from "effect"
import * as Awa from "../src/Awa.ts"
import { AwaClient } from "../src/AwaClient.ts"
import { handler } from "../src/Handler.ts"
import { eventually, recordingTracer } from "./support.ts"

const Idle = Job.define({ kind: "idle_tick", args: Schema.Struct({ n: Schema.Number }), queue: "idle" })

const isRoot = (span: Tracer.NativeSpan) => Option.isNone(span.parent)

/**
 * Runs a worker on a fast idle schedule while three delayed jobs go through it one after the
 * other: each needs promotion ticks and claim polls before it runs, so the worker has ticked
 * many times (claim every 20 ms, promotion every 20 ms, election every 50 ms) by the end. The
 * test's own polling runs untraced.
 */
const runIdleTicks = (backgroundSpans: boolean | undefined) => {
  const { spans, tracer } = recordingTracer()
  return Effect.gen(function* () {
    const client = yield* AwaClient
    yield* Effect.gen(function* () {
      for (let n = 0; n < 3; n++) {
        const job = yield* client.insert(Idle, { n }, { delay: "200 millis" })
        yield* eventually(
          Effect.map(client.storage.getJob(job.id), (j) => j.state === "completed"),
          20_000,
          `job ${n} completed`
        ).pipe(Effect.withTracerEnabled(false))
      }
    }).pipe(
      Effect.provide(
        Awa.worker({
          queues: { idle: { pollInterval: "20 millis" } },
          handlers: [handler(Idle, () => Effect.void)],
          backgroundSpans,
          maintenance: {
            promoteInterval: "20 millis",
            electionInterval: "50 millis",
            rotateInterval: "50 millis"
          }
        })
      ),
      Effect.scoped,
      // recorded from the worker's start on (the test database and the schema fence are not its)
      Effect.withTracer(tracer)
    )
    return spans
  }).pipe(Effect.provide(Awa.layerPg().pipe(Layer.provideMerge(TestDatabase.layer()))))
}

describe("tracing of background work", () => {
  it.live(
    "by default an idle worker's loops emit no spans; the jobs' own spans are unchanged",
    () =>
      Effect.gen(function* () {
        const spans = yield* runIdleTicks(undefined)
        const sends = spans.filter((s) => s.name === "send idle_tick")
        const processes = spans.filter((s) => s.name === "process idle_tick")
        assert.strictEqual(sends.length, 3)
        assert.strictEqual(processes.length, 3)
        const jobTraces = new Set(sends.map((s) => s.traceId))
        // every span belongs to a job's trace: no root per claim, promotion, election or flush
        const stray = spans.filter((s) => !jobTraces.has(s.traceId)).map((s) => s.name)
        assert.deepStrictEqual(stray, [])
        assert.deepStrictEqual(
          spans.filter(isRoot).map((s) => s.name),
          ["send idle_tick", "send idle_tick", "send idle_tick"]
        )
      }),
    60_000
  )

  it.live(
    "with backgroundSpans every claim and maintenance tick is one span, its queries under it",
    () =>
      Effect.gen(function* () {
        const spans = yield* runIdleTicks(true)
        const claims = spans.filter((s) => s.name === "awa.claim idle")
        const promotions = spans.filter((s) => s.name === "awa.maintenance promote")
        assert.isAbove(claims.length, 3)
        assert.isAbove(promotions.length, 3)
        const ids = new Set([...claims, ...promotions].map((s) => s.spanId))
        const queries = spans.filter((s) => {
          const parent = Option.getOrUndefined(s.parent)
          return parent !== undefined && ids.has(parent.spanId)
        })
        assert.isAtLeast(queries.length, claims.length + promotions.length, "each tick's query is its child")
      }),
    60_000
  )

  it.effect(
    "a caller's awa:traceparent wins over the current span; a malformed one is a ValidationError",
    () =>
      Effect.gen(function* () {
        const client = yield* AwaClient
        const mine = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
        const job = yield* client
          .insert(Idle, { n: 1 }, { metadata: { [Traceparent.metadataKey]: mine } })
          .pipe(Effect.withSpan("request"))
        const stored = yield* client.storage.getJob(job.id)
        assert.strictEqual(stored.metadata[Traceparent.metadataKey], mine)
        for (const bad of ["nope", "00-00000000000000000000000000000000-b7ad6b7169203331-01", 42]) {
          const error = yield* Effect.flip(
            client.insert(Idle, { n: 2 }, { metadata: { [Traceparent.metadataKey]: bad } })
          )
          assert.instanceOf(error, ValidationError)
          assert.strictEqual((error as ValidationError).field, "metadata.awa:traceparent")
        }
        assert.strictEqual(
          (yield* client.storage.listJobs({ queue: "idle" })).length,
          1,
          "nothing else written"
        )
      }).pipe(Effect.provide(Awa.layerSim()))
  )
})
