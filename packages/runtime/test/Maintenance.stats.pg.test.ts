/**
 * The leader's duties behind the operator surface (migration 0031, issue 18 items 1 and 2): it
 * samples per-queue figures (the statistics then carry enqueue, complete and fail rates), and it
 * writes the ring's prune state when the state changes, not on every tick.
 */
import { Job } from "@awa/core"
import { QueueStorage } from "@awa/storage"
import { TestDatabase } from "@awa/testing"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Layer, Metric, Schema } from "effect"
import { SqlClient } from "effect/sql"
import * as Awa from "../src/Awa.ts"
import { AwaClient } from "../src/AwaClient.ts"
import { handler } from "../src/Handler.ts"
import * as RuntimeMetrics from "../src/RuntimeMetrics.ts"
import { eventually } from "./support.ts"

const Ok = Job.define({ kind: "ok", args: Schema.Struct({ n: Schema.Number }), queue: "sampled" })
const Bad = Job.define({ kind: "bad", args: Schema.Struct({ n: Schema.Number }), queue: "sampled" })

const AwaLive = () =>
  Awa.layerPg({ rotateMaxAgeMs: 3_600_000 }).pipe(
    Layer.provideMerge(TestDatabase.layer({ maxConnections: 8 }))
  )

/** Rotate-prune ticks of this test's leader that found nothing to prune. */
const noopTicks = Effect.map(
  Metric.value(RuntimeMetrics.prunes.pipe(Metric.withAttributes({ outcome: "noop", reason: "" }))),
  (s) => s.count
)

const ratesOf = Effect.map(
  Effect.flatMap(QueueStorage, (s) => s.queueStats({ windowMs: 3_600_000 })),
  (r) => r.queues.find((q) => q.queue === "sampled")?.rates ?? null
)

describe("leader samples and prune state", () => {
  it.live(
    "the statistics carry the sampled rates; the prune state row changes only with the state",
    () =>
      Effect.gen(function* () {
        const client = yield* AwaClient
        const sql = yield* SqlClient.SqlClient
        yield* Effect.scoped(
          Effect.gen(function* () {
            // the first samples are the baseline; jobs enqueued after it are counted
            yield* eventually(
              Effect.map(
                sql<{ n: number }>`SELECT count(*)::int AS n FROM awa.stat_samples`,
                (r) => r[0]!.n >= 1
              )
            )
            yield* client.insertMany(
              Ok,
              Array.from({ length: 6 }, (_, n) => ({ n }))
            )
            yield* client.insertMany(
              Bad,
              Array.from({ length: 2 }, (_, n) => ({ n })),
              { maxAttempts: 1 }
            )
            yield* eventually(
              Effect.map(
                ratesOf,
                (r) => r !== null && r.enqueued === 8 && r.completed === 6 && r.failed === 2
              ),
              30_000,
              "rates of 8 enqueued, 6 completed, 2 failed"
            )
            const rates = (yield* ratesOf)!
            assert.isAbove(rates.enqueuedPerSecond, 0)
            // the leader's prune state, once the queue is idle (every tick ends in a noop): the row
            // keeps its `since` over many ticks, so the leader did not rewrite it
            const noops = yield* noopTicks
            const row = sql<{ since: Date; outcome: string }>`
              SELECT since, outcome FROM awa.maintenance_state WHERE ring = 'queue'`
            yield* eventually(
              Effect.map(Effect.zip(row, noopTicks), ([r, n]) => r[0]?.outcome === "ok" && n >= noops + 3)
            )
            const [first] = yield* row
            const later = yield* noopTicks
            yield* eventually(
              Effect.map(noopTicks, (n) => n >= later + 10),
              20_000,
              "ten more noop ticks"
            )
            const [again] = yield* row
            assert.deepStrictEqual(again, first, "no write while the state repeats")
          }).pipe(
            Effect.provide(
              Awa.worker({
                queues: { sampled: {} },
                handlers: [handler(Ok, () => Effect.void), handler(Bad, () => Effect.fail(new Error("no")))],
                maintenance: {
                  electionInterval: "50 millis",
                  rotateInterval: "50 millis",
                  rotateMinRows: 1,
                  statsSampleInterval: "1 second"
                }
              })
            )
          )
        )
      }).pipe(Effect.provide(AwaLive()), Effect.provideService(Metric.MetricRegistry, new Map())),
    60_000
  )
})
