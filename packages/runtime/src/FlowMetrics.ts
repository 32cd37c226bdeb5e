/**
 * Flow-control metrics (issue 20 item 5; capabilities.md §12, §13, §25, §26), beside the
 * runtime's own in `RuntimeMetrics.ts`: per process, attribute `awa.queue`.
 *
 * - `awa.claim.throttled`: times a dispatcher found its queue's token bucket empty and waited
 *   for the next token instead of claiming (rate limit: the process's bucket, or the fleet's, when
 *   a rated claim found no token).
 * - `awa.concurrency.permits_held` / `awa.concurrency.overflow_held`: in weighted mode, the
 *   permits each queue holds (claimed attempts of this process) and how many of them come from
 *   the shared overflow rather than its floor; set whenever they change hands.
 * - `awa.enqueue.backpressure.signaled` / `.rejected`: inserts that carried a `pressure` answer,
 *   and inserts refused with `BackpressureRejected` (counted per call, not per job).
 */
import { type Context, Effect, Metric } from "effect"
import type { PoolSnapshot } from "./ConcurrencyPermits.ts"

const counter = (name: string, description: string) =>
  Metric.counter(name, { description, incremental: true })

export const claimThrottled = counter(
  "awa.claim.throttled",
  "claims deferred because the queue's rate limit had no token, by queue"
)
export const permitsHeld = Metric.gauge("awa.concurrency.permits_held", {
  description: "weighted mode: permits held by the queue's claimed attempts in this process"
})
export const overflowHeld = Metric.gauge("awa.concurrency.overflow_held", {
  description: "weighted mode: permits the queue holds from the shared overflow (beyond its floor)"
})
export const backpressureSignaled = counter(
  "awa.enqueue.backpressure.signaled",
  "inserts answered with the queue's depth (backpressure: signal), by queue"
)
export const backpressureRejected = counter(
  "awa.enqueue.backpressure.rejected",
  "inserts refused because the queue's depth reached the limit (backpressure: reject), by queue"
)

export interface FlowRecorder {
  readonly throttled: (queue: string) => void
  readonly permits: (snapshot: PoolSnapshot) => void
  readonly signaled: (queue: string) => void
  readonly rejected: (queue: string) => void
}

/** A recorder bound to the metric registry of the context it is made in. */
export const makeRecorder: Effect.Effect<FlowRecorder> = Effect.map(Effect.context<never>(), (context) =>
  recorderFor(context)
)

const recorderFor = (context: Context.Context<never>): FlowRecorder => {
  const tagged = new Map<string, Metric.Metric<number, unknown>>()
  const byQueue = (metric: Metric.Metric<number, unknown>, queue: string) => {
    const key = `${metric.id}\u0000${queue}`
    let m = tagged.get(key)
    if (m === undefined) {
      m = metric.pipe(Metric.withAttributes({ "awa.queue": queue }))
      tagged.set(key, m)
    }
    return m
  }
  return {
    throttled: (queue) => byQueue(claimThrottled, queue).updateUnsafe(1, context),
    permits: (snapshot) => {
      for (const q of snapshot.queues) {
        byQueue(permitsHeld, q.queue).updateUnsafe(q.held, context)
        byQueue(overflowHeld, q.queue).updateUnsafe(q.overflowHeld, context)
      }
    },
    signaled: (queue) => byQueue(backpressureSignaled, queue).updateUnsafe(1, context),
    rejected: (queue) => byQueue(backpressureRejected, queue).updateUnsafe(1, context)
  }
}
