/**
 * The fleet-wide rate limit (docs/adr/0036-fleet-rate-limit.md) on the simulation layer with
 * virtual time: two workers sharing one storage (the simulation's fleet) start 30 jobs at 10/s
 * burst 10 together, not 10/s each; starts are spaced at the rate (the claim says when the next
 * token is due), never more than `burst + rate × W` in a window of W; bad settings fail the layer.
 */
import { AwaConfigError, Job, ValidationError } from "@awa/core"
import { KeyGrants } from "@awa/storage"
import { assert, describe, it } from "@effect/vitest"
import { Clock, Effect, Exit, Layer, Metric, Schema, Scope } from "effect"
import * as Awa from "../src/Awa.ts"
import { AwaClient } from "../src/AwaClient.ts"
import * as FlowMetrics from "../src/FlowMetrics.ts"
import { handler } from "../src/Handler.ts"
import * as QueueOverrides from "../src/QueueOverrides.ts"
import type { QueueOptions } from "../src/Worker.ts"
import { advance, captureWarnings, plainQueueBase } from "./support.ts"

const Tick = Job.define({ kind: "fleet_tick", args: Schema.Struct({ n: Schema.Number }), queue: "fleet" })

/** A worker on queue "fleet" whose handler records its start instant (virtual ms). */
const startWorker = (queue: QueueOptions, starts: Array<number>) =>
  Effect.gen(function* () {
    const scope = yield* Scope.make()
    yield* Layer.buildWithScope(
      Awa.worker({
        queues: { fleet: { pollInterval: "1 second", maxConcurrency: 50, ...queue } },
        handlers: [
          handler(Tick, () =>
            Effect.flatMap(Clock.currentTimeMillis, (t) => Effect.sync(() => void starts.push(t)))
          )
        ],
        maintenance: false
      }),
      scope
    )
    return Scope.close(scope, Exit.void)
  })

/** A worker on queue "fleet" whose handler takes 300 ms (virtual) and records its key's run. */
const startKeyedWorker = (queue: QueueOptions, runs: Array<{ key: string; start: number; end: number }>) =>
  Effect.gen(function* () {
    const scope = yield* Scope.make()
    yield* Layer.buildWithScope(
      Awa.worker({
        queues: { fleet: { maxConcurrency: 50, ...queue } },
        handlers: [
          handler(Tick, ({ n }) =>
            Effect.gen(function* () {
              const start = yield* Clock.currentTimeMillis
              yield* Effect.sleep("300 millis")
              runs.push({ key: `k${n % 3}`, start, end: yield* Clock.currentTimeMillis })
            })
          )
        ],
        maintenance: false
      }),
      scope
    )
    return Scope.close(scope, Exit.void)
  })

const range = (n: number) => Array.from({ length: n }, (_, i) => ({ n: i }))

describe("fleet-wide rate limit (simulation layer, TestClock)", () => {
  it.effect(
    "two workers, 30 jobs at 10/s burst 10: 10 at once, then one per 100 ms over both; 2 s in all",
    () =>
      Effect.gen(function* () {
        const client = yield* AwaClient
        yield* client.insertMany(Tick, range(30))
        const starts: Array<number> = []
        const t0 = yield* Clock.currentTimeMillis
        const limit = { fleetRateLimit: { maxRate: 10, burst: 10 } }
        const stopA = yield* startWorker(limit, starts)
        const stopB = yield* startWorker(limit, starts)
        yield* advance(4000, 5)
        assert.strictEqual(starts.length, 30)
        const at = starts.map((t) => t - t0).sort((a, b) => a - b)
        // per process it would take 1 s (each worker 10/s); for the fleet, 20 tokens after the burst: 2 s
        assert.isAtLeast(at[29]!, 2000, "the two workers shared one limit")
        assert.isAtMost(at[29]!, 2100, "the next token's time, not the 1 s poll, woke the claims")
        // spaced at the rate: the 10 of the burst at once, then each start within 50 ms of its token
        // (at the 1 s poll they would come ten at a time)
        assert.isAtMost(at[9]!, 20)
        for (let i = 10; i < 30; i++)
          assert.isAtMost(at[i]!, (i - 9) * 100 + 50, `start ${i}: ${JSON.stringify(at)}`)
        // the bound over every window: at most burst + rate × W starts in [at[i], at[j]]
        for (let i = 0; i < at.length; i++)
          for (let j = i; j < at.length; j++)
            assert.isAtMost(j - i + 1, 10 + Math.floor((at[j]! - at[i]!) / 100) + 1e-9, `window ${i}..${j}`)
        // claims that found no token are counted as throttled
        const throttled = yield* Metric.value(
          FlowMetrics.claimThrottled.pipe(Metric.withAttributes({ "awa.queue": "fleet" }))
        )
        assert.isAtLeast(throttled.count, 1)
        yield* stopA
        yield* stopB
      }).pipe(Effect.provide(Awa.layerSim()), Effect.provideService(Metric.MetricRegistry, new Map()))
  )

  it.effect(
    "with a key policy too (0045): two workers, 30 jobs over 3 keys of limit 2, 300 ms each, at 10/s burst 10: the rate and the keys both hold",
    () =>
      Effect.gen(function* () {
        const client = yield* AwaClient
        const grants = yield* KeyGrants
        yield* grants.create({ id: "tenants", maxInFlight: 2 })
        yield* Effect.forEach(
          range(30),
          (args) => client.insert(Tick, args, { concurrencyKey: `k${args.n % 3}` }),
          {
            discard: true
          }
        )
        const runs: Array<{ key: string; start: number; end: number }> = []
        const t0 = yield* Clock.currentTimeMillis
        const queue: QueueOptions = {
          keyPolicy: "tenants",
          fleetRateLimit: { maxRate: 10, burst: 10 },
          pollInterval: "100 millis"
        }
        const stopA = yield* startKeyedWorker(queue, runs)
        const stopB = yield* startKeyedWorker(queue, runs)
        yield* advance(10_000, 5)
        assert.strictEqual(runs.length, 30)
        const at = runs.map((r) => r.start - t0).sort((a, b) => a - b)
        // the keys alone would run 6 at a time, 300 ms each: all 30 started by ~1.2 s. The rate's 20
        // tokens after the burst take 2 s
        assert.isAtLeast(at[29]!, 2000, `the rate held: ${JSON.stringify(at)}`)
        for (let i = 0; i < at.length; i++)
          for (let j = i; j < at.length; j++)
            assert.isAtMost(j - i + 1, 10 + Math.floor((at[j]! - at[i]!) / 100) + 1e-9, `window ${i}..${j}`)
        // never more than 2 running per key at any instant (a start at another's end does not overlap)
        for (const r of runs) {
          const overlapping = runs.filter(
            (o) => o.key === r.key && o.start <= r.start && o.end > r.start
          ).length
          assert.isAtMost(overlapping, 2, `key ${r.key} at ${r.start - t0}`)
        }
        yield* stopA
        yield* stopB
      }).pipe(Effect.provide(Awa.layerSim()))
  )

  it.effect(
    "a hot override retunes the fleet rate on the next refresh: 60 jobs at 10/s, then 50/s, end by ~2 s instead of 5 s",
    () =>
      Effect.gen(function* () {
        const client = yield* AwaClient
        yield* client.insertMany(Tick, range(60))
        const starts: Array<number> = []
        const t0 = yield* Clock.currentTimeMillis
        const scope = yield* Scope.make()
        yield* Layer.buildWithScope(
          Awa.worker({
            queues: {
              fleet: {
                maxConcurrency: 50,
                pollInterval: "1 second",
                fleetRateLimit: { maxRate: 10, burst: 10 }
              }
            },
            handlers: [
              handler(Tick, () =>
                Effect.flatMap(Clock.currentTimeMillis, (t) => Effect.sync(() => void starts.push(t)))
              )
            ],
            overrideRefreshInterval: "200 millis",
            maintenance: false
          }),
          scope
        )
        yield* advance(50, 5)
        assert.strictEqual(starts.length, 10, "the burst")
        yield* client.setQueueOverrides("fleet", { fleetRateLimit: { maxRate: 50, burst: 10 } })
        yield* advance(6000, 5)
        assert.strictEqual(starts.length, 60)
        const at = starts.map((t) => t - t0).sort((a, b) => a - b)
        // at 10/s the 50 after the burst take 5 s; at 50/s (from the refresh at ≤ 200 ms) about 1 s
        assert.isAtMost(at[59]!, 2000, `the override applied: ${JSON.stringify(at)}`)
        // and it still limits: 50 tokens at 50/s cannot come in less than ~0.8 s after the burst
        assert.isAtLeast(at[59]!, 800)
        // cleared, the code's 10/s is back from the next refresh: the burst of 10, then 10/s
        yield* client.clearQueueOverrides("fleet")
        yield* advance(400, 5)
        yield* client.insertMany(Tick, range(20))
        const t1 = yield* Clock.currentTimeMillis
        yield* advance(4000, 5)
        assert.strictEqual(starts.length, 80)
        const after = starts
          .slice(60)
          .map((t) => t - t1)
          .sort((a, b) => a - b)
        assert.isAtLeast(after[19]!, 900, `10/s again: ${JSON.stringify(after)}`)
        yield* Scope.close(scope, Exit.void)
      }).pipe(Effect.provide(Awa.layerSim()))
  )

  it.effect(
    "a fleet rate override is validated, and ignored with a warning on a queue without a fleet rate",
    () =>
      Effect.gen(function* () {
        const client = yield* AwaClient
        for (const [fleetRateLimit, why] of [
          [{ maxRate: 0 }, "maxRate 0"],
          [{ maxRate: 100_001 }, "maxRate above 100,000"],
          [{ maxRate: 5, burst: 1_000_001 }, "burst above 1,000,000"],
          [{ maxRate: 5, burst: 1.5 }, "a fractional burst"]
        ] as const) {
          const exit = yield* Effect.exit(client.setQueueOverrides("fleet", { fleetRateLimit }))
          const failure = Exit.isFailure(exit) ? exit.cause.reasons[0] : undefined
          const error = failure?._tag === "Fail" ? failure.error : undefined
          assert.instanceOf(error, ValidationError, why)
          assert.strictEqual((error as ValidationError).field, "fleetRateLimit", why)
        }
        assert.deepStrictEqual(yield* client.getQueueOverrides("fleet"), [], "nothing was stored")
        const { warnings, layer: capture } = captureWarnings()
        const base = plainQueueBase
        const live = QueueOverrides.liveSettings(base, 0)
        yield* QueueOverrides.apply(base, live, { fleetRateLimit: { maxRate: 5, burst: 1 } }, new Map()).pipe(
          Effect.provide(capture)
        )
        assert.strictEqual(live.fleetRate, undefined, "an override cannot create a fleet rate")
        assert.match(warnings[0] ?? "", /fleetRateLimit override of queue plain ignored/)
        const rated = { ...base, queue: "rated", fleetRate: { maxRate: 10, burst: 10 } }
        const liveRated = QueueOverrides.liveSettings(rated, 0)
        yield* QueueOverrides.apply(rated, liveRated, { fleetRateLimit: { maxRate: 2, burst: 3 } }, new Map())
        assert.deepStrictEqual(liveRated.fleetRate, { maxRate: 2, burst: 3 })
        yield* QueueOverrides.apply(rated, liveRated, undefined, new Map())
        assert.deepStrictEqual(liveRated.fleetRate, { maxRate: 10, burst: 10 })
      }).pipe(Effect.provide(Awa.layerSim()))
  )

  it.effect("invalid settings fail the layer with AwaConfigError", () =>
    Effect.gen(function* () {
      for (const queue of [
        { fleetRateLimit: { maxRate: 0 } },
        { fleetRateLimit: { maxRate: 100_001 } },
        { fleetRateLimit: { maxRate: 5, burst: -1 } },
        { fleetRateLimit: { maxRate: 5, burst: 1_000_001 } }
      ]) {
        const exit = yield* Effect.exit(startWorker(queue, []))
        assert.isTrue(Exit.isFailure(exit), JSON.stringify(queue))
        const failure = Exit.isFailure(exit) ? exit.cause.reasons[0] : undefined
        const error = failure?._tag === "Fail" ? failure.error : undefined
        assert.instanceOf(error, AwaConfigError, JSON.stringify(queue))
        assert.isTrue(
          (error as AwaConfigError).issues.some((i) => i.path === "queues.fleet.fleetRateLimit"),
          JSON.stringify((error as AwaConfigError).issues)
        )
      }
    }).pipe(Effect.provide(Awa.layerSim()))
  )
})
