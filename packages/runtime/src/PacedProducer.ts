/**
 * `PacedProducer` (capabilities.md §25; docs/adr/0028-flow-control.md): paces a producer so its
 * queue's depth stays near a target instead of growing without bound when it enqueues faster
 * than the fleet completes.
 *
 * ```ts
 * const paced = yield* PacedProducer.make({ queue: "email", targetDepth: 1000 })
 * yield* Effect.forever(Effect.andThen(paced.pace, client.insert(SendEmail, next())))
 * ```
 *
 * **Control** Every `sampleInterval` it reads the queue's depth (the capped count, up to 2 ×
 * `targetDepth`: the cost is bounded by that, never by the backlog) and sets its rate to what
 * the fleet drained since the last reading (what it sent minus the depth's growth, per second)
 * plus the gap to the target closed over five intervals: rate = drained + (target − depth) /
 * (5 × interval). A proportional controller around the measured completion rate: under
 * oversupply the rate settles at what the workers complete and the depth at the target. A
 * capped reading (depth ≥ 2 × target: the growth is unknown) halves the rate instead.
 * `pace` waits for the next send slot at the current rate (`1 / rate` apart).
 *
 * The producer paces itself; it does not refuse anything (that is `backpressure: { reject }`).
 */
import { AwaConfigError } from "@awa/core"
import { type FlowStorage as Flow, FlowStorage } from "@awa/storage"
import { Clock, Duration, Effect, Schedule } from "effect"

export interface PacedProducerOptions {
  readonly queue: string
  /** Depth to hold the queue near (1–500,000). */
  readonly targetDepth: number
  /** Send rate to start at, jobs/s. Default 100 (between `minRate` and `maxRate`). */
  readonly initialRate?: number | undefined
  /** Lowest rate, jobs/s (> 0). Default 1. */
  readonly minRate?: number | undefined
  /** Highest rate, jobs/s (≤ 100,000). Default 10,000. */
  readonly maxRate?: number | undefined
  /** How often the depth is read. Default 1 s (50 ms – 1 min). */
  readonly sampleInterval?: Duration.Input | undefined
}

export interface PacedProducer {
  /** Waits until the next send is due at the current rate; call it before each insert. */
  readonly pace: Effect.Effect<void>
  /** The current send rate, jobs/s. */
  readonly rate: Effect.Effect<number>
  /** The last depth read (`undefined` before the first). */
  readonly lastDepth: Effect.Effect<Flow.CappedDepth | undefined>
}

/** One depth reading and what was sent since the previous one. */
export interface Sample {
  readonly rate: number
  readonly previous: Flow.CappedDepth | undefined
  readonly depth: Flow.CappedDepth
  /** Sends since the previous reading. */
  readonly sent: number
  readonly intervalMs: number
  readonly target: number
}

/** The rate after a reading (pure; exported for tests and docs). */
export const nextRate = (sample: Sample, bounds: { readonly min: number; readonly max: number }) => {
  const { rate, previous, depth, sent, intervalMs, target } = sample
  const seconds = intervalMs / 1000
  let next: number
  if (depth.capped) next = rate * 0.5
  else {
    // growth unknown after a capped reading: assume what was sent was drained
    const growth = previous === undefined || previous.capped ? 0 : depth.count - previous.count
    const drained = Math.max(0, (sent - growth) / seconds)
    next = drained + (target - depth.count) / (5 * seconds)
  }
  return Math.min(bounds.max, Math.max(bounds.min, next))
}

export const make = (options: PacedProducerOptions) =>
  Effect.gen(function* () {
    const issues: Array<{ path: string; reason: string }> = []
    const target = options.targetDepth
    if (!(Number.isInteger(target) && target >= 1 && target <= 500_000))
      issues.push({ path: "targetDepth", reason: "must be an integer 1–500,000" })
    const min = options.minRate ?? 1
    const max = options.maxRate ?? 10_000
    if (!(min > 0 && min <= max && max <= 100_000))
      issues.push({ path: "minRate", reason: "need 0 < minRate ≤ maxRate ≤ 100,000" })
    const initial = options.initialRate ?? Math.min(max, Math.max(min, 100))
    if (!(initial >= min && initial <= max))
      issues.push({ path: "initialRate", reason: "must be between minRate and maxRate" })
    const decoded = Duration.fromInput(options.sampleInterval ?? 1000)
    const sampleMs = decoded._tag === "Some" ? Duration.toMillis(decoded.value) : Number.NaN
    if (!(sampleMs >= 50 && sampleMs <= 60_000))
      issues.push({ path: "sampleInterval", reason: "must be 50 ms – 1 min" })
    if (issues.length > 0) return yield* new AwaConfigError({ issues })

    const flow = yield* FlowStorage.FlowStorage
    let rate = initial
    let nextAt: number | undefined
    let last: Flow.CappedDepth | undefined
    let sentSince = 0
    const cap = Math.min(FlowStorage.maxDepthCap, 2 * target)

    yield* flow.depth(options.queue, cap).pipe(
      Effect.flatMap((depth) =>
        Effect.sync(() => {
          rate = nextRate(
            { rate, previous: last, depth, sent: sentSince, intervalMs: sampleMs, target },
            { min, max }
          )
          last = depth
          sentSince = 0
        })
      ),
      Effect.catchCause((cause) =>
        Effect.logWarning(`depth of queue ${options.queue} unreadable; rate kept`, cause)
      ),
      Effect.repeat(Schedule.spaced(sampleMs)),
      Effect.delay(sampleMs),
      Effect.annotateLogs({ module: "PacedProducer", queue: options.queue }),
      Effect.forkScoped
    )

    // A send slot missed by less than `catchUpMs` (a slow insert, a coarse timer) is still taken,
    // so the rate holds; older slots are dropped rather than sent as a burst.
    const catchUpMs = 100
    const pace = Effect.flatMap(Clock.currentTimeMillis, (now) => {
      const due = nextAt === undefined || nextAt < now - catchUpMs ? now : nextAt
      nextAt = due + 1000 / rate
      sentSince++
      return due > now ? Effect.sleep(Math.ceil(due - now)) : Effect.void
    })

    return {
      pace,
      rate: Effect.sync(() => rate),
      lastDepth: Effect.sync(() => last)
    } satisfies PacedProducer
  })
