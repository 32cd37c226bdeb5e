/**
 * Rate limiting on Postgres, real time (capabilities.md §12; docs/adr/0028-flow-control.md):
 * one worker process at maxRate 200/s, burst 200, a backlog larger than it can start. After the
 * burst (and two seconds of starts that drain what refilled during it), the starts observed over
 * a 10 s window (2,000 starts) must run at 200/s within 5 %.
 *
 * Why 10 s and not the 60 s: the bucket makes the upper bound exact (at most
 * burst + rate × T starts in any window), so what the window must show is that the rate is also
 * *reached* under load; 2,000 starts make the timing of the first and last start (a few ms of
 * claim latency each) 0.1–0.3 % of the window. The 60 s figure was measured by hand once and is
 * in docs/benchmarks.md.
 */
import { Job } from "@awa/core"
import { TestDatabase } from "@awa/testing"
import { assert, layer } from "@effect/vitest"
import { Effect, Exit, Layer, Schema, Scope } from "effect"
import * as Awa from "../src/Awa.ts"
import { AwaClient } from "../src/AwaClient.ts"
import { handler } from "../src/Handler.ts"
import { eventually } from "./support.ts"

const Paced = Job.define({ kind: "paced", args: Schema.Struct({ n: Schema.Number }), queue: "paced" })

const AwaLive = Awa.layerPg({ tracing: false }).pipe(
  Layer.provideMerge(TestDatabase.layer({ maxConnections: 8 }))
)

const maxRate = 200
/**
 * Starts skipped after the burst: while the burst's 200 jobs are being claimed the bucket refills
 * (≈ 0.5 s on this machine, ≈ 100 tokens), and those start at once after it. Counting them in a
 * 10 s window reads +5 % (measured: 209.9/s); 2 s of starts later the bucket is empty.
 */
const skip = 400
const burst = 200
/** 2,000 (10 s) in CI; `AWA_RATE_WINDOW_STARTS=12000` for the 60 s figure of docs/benchmarks.md. */
const windowStarts = Number(process.env.AWA_RATE_WINDOW_STARTS ?? 2000)

layer(AwaLive, { excludeTestServices: true, timeout: "60 seconds" })("rate limiting on Postgres", (it) => {
  it.effect(
    `the observed start rate over ${windowStarts} starts after the burst is ${maxRate}/s within 5 %`,
    () =>
      Effect.gen(function* () {
        const client = yield* AwaClient
        const total = burst + skip + windowStarts + 200
        yield* client.insertMany(
          Paced,
          Array.from({ length: total }, (_, n) => ({ n }))
        )
        const starts: Array<number> = []
        const scope = yield* Effect.acquireRelease(Scope.make(), (s) => Scope.close(s, Exit.void))
        yield* Layer.buildWithScope(
          Awa.worker({
            queues: {
              paced: { maxConcurrency: 100, pollInterval: "50 millis", rateLimit: { maxRate, burst } }
            },
            handlers: [
              handler(Paced, () =>
                Effect.sync(() => {
                  starts.push(performance.now())
                })
              )
            ],
            watchdog: { thread: false },
            tracing: false,
            maintenance: false
          }),
          scope
        )
        yield* eventually(
          Effect.sync(() => starts.length > burst + skip + windowStarts),
          (windowStarts / maxRate) * 1000 + 30_000,
          "the window's starts"
        )
        yield* Scope.close(scope, Exit.void)
        // the burst: the first `burst` starts come at once (well under a second)
        assert.isBelow(starts[burst - 1]! - starts[0]!, 1000, "the burst starts at once")
        const first = starts[burst + skip]!
        const last = starts[burst + skip + windowStarts]!
        const rate = windowStarts / ((last - first) / 1000)
        console.log(
          `rate limit ${maxRate}/s: ${windowStarts} starts in ${((last - first) / 1000).toFixed(3)} s = ${rate.toFixed(2)}/s`
        )
        assert.isAbove(rate, maxRate * 0.95, `observed ${rate.toFixed(1)} starts/s`)
        assert.isBelow(rate, maxRate * 1.05, `observed ${rate.toFixed(1)} starts/s`)
      })
  )
})
