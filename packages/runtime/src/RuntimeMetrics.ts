/**
 * The runtime's own events as Effect `Metric` instruments (issue 18 item 4, capabilities.md §26):
 * what this process enqueued, claimed and finished, how long handlers ran, how long jobs waited
 * to be picked up, what its maintenance leader rescued and pruned. Any Effect metrics exporter
 * sees them (Prometheus text on the admin server, OTLP through `@effect/opentelemetry`); the
 * queue-wide gauges read from storage are in `@awa/effect`'s `QueueMetrics`.
 *
 * **Per process, not per queue-wide truth** Each process counts its own events: sum them over the
 * fleet. An outcome is counted once storage has applied it (a stale completion, whose attempt was
 * rescued meanwhile, is not); an enqueue when the call returned (inside a caller's transaction
 * that later rolls back, it is still counted).
 *
 * **Cost** On the hot path every update is synchronous (`updateUnsafe` with the context captured
 * when the recorder was made): two map lookups for the context tagged with the job's queue and
 * kind, then the update. No fiber, no string key, no allocation once a (queue, kind) pair has
 * been seen. The tagged context is built once per pair: `Metric.withAttributes` would add the
 * attributes to the context again on every update (a new context per update: measurable per-job
 * cost in the drain profile, ADR 0031).
 */
import type { JobState } from "@awa/core"
import type { ClaimedJob } from "@awa/storage"
import { Context, Effect, Metric } from "effect"

const counter = (name: string, description: string) =>
  Metric.counter(name, { description, incremental: true })

/** Seconds, 1 ms to ~9 min in powers of two. */
const secondsBoundaries = Metric.exponentialBoundaries({ start: 0.001, factor: 2, count: 20 })

/** Jobs enqueued by this process (calls that returned), by queue and kind. */
export const jobsEnqueued = counter("awa.job.enqueued", "jobs enqueued by this process, by queue and kind")
/** Attempts claimed by this process's workers, by queue and kind. */
export const jobsClaimed = counter("awa.job.claimed", "attempts claimed by this process, by queue and kind")
/** Attempts that ended completed. */
export const jobsCompleted = counter("awa.job.completed", "attempts completed, by queue and kind")
/** Attempts that ended with a retry scheduled. */
export const jobsRetried = counter(
  "awa.job.retried",
  "attempts that failed and will be retried, by queue and kind"
)
/** Attempts that ended failed (retries exhausted or a terminal error; dead-lettered ones included). */
export const jobsFailed = counter("awa.job.failed", "attempts that failed for good, by queue and kind")
/** Attempts that ended cancelled. */
export const jobsCancelled = counter("awa.job.cancelled", "attempts cancelled, by queue and kind")
/** Attempts the maintenance leader of this process rescued, by reason, queue and kind. */
export const jobsRescued = counter(
  "awa.job.rescued",
  "attempts rescued by this process's leader, by reason, queue and kind"
)
/** Handler run time of attempts that reached an applied outcome, seconds, by queue and kind. */
export const handlerDuration = Metric.histogram("awa.job.handler_duration_seconds", {
  description: "handler run time, by queue and kind",
  boundaries: secondsBoundaries
})
/** Claim time minus the job's run-at, seconds, by queue and kind. */
export const pickupLatency = Metric.histogram("awa.job.pickup_latency_seconds", {
  description: "time from a job's run_at to its claim, by queue and kind",
  boundaries: secondsBoundaries
})
/** Prune attempts of this process's leader, by outcome (pruned, blocked, idle) and block reason. */
export const prunes = counter("awa.maintenance.prunes", "prune attempts by outcome and block reason")
/** 1 while this process is the maintenance leader. */
export const isLeader = Metric.gauge("awa.leader.is_leader", {
  description: "1 while this process leads maintenance"
})

export interface Recorder {
  readonly enqueued: (queue: string, kind: string, count: number) => void
  readonly claimed: (job: ClaimedJob) => void
  /** An applied outcome; `runMs` is the handler's run time when it ran. */
  readonly finished: (job: ClaimedJob, state: JobState, runMs: number | undefined) => void
  /** One rescued attempt (its queue and kind come from storage's answer). */
  readonly rescued: (reason: string, queue: string, kind: string) => void
  readonly pruned: (outcome: string, reason: string | undefined) => void
  readonly leading: (leader: boolean) => void
}

const outcomeCounter: Partial<Record<JobState, Metric.Metric<number, unknown>>> = {
  completed: jobsCompleted,
  retryable: jobsRetried,
  failed: jobsFailed,
  cancelled: jobsCancelled
}

/** A recorder bound to the registry of the context it is made in (the default one unless provided). */
export const makeRecorder: Effect.Effect<Recorder> = Effect.map(Effect.context<never>(), (context) =>
  recorderFor(context)
)

const recorderFor = (context: Context.Context<never>): Recorder => {
  // The attributes already in the context (a user's `CurrentMetricAttributes`) come first, as
  // `Metric.withAttributes` merges them; ours override.
  const inherited = Context.get(context, Metric.CurrentMetricAttributes)
  const taggedContext = (attributes: Record<string, string>) =>
    Context.add(context, Metric.CurrentMetricAttributes, { ...inherited, ...attributes })
  // queue → kind → context carrying both as metric attributes
  const byQueue = new Map<string, Map<string, Context.Context<never>>>()
  const jobContext = (queue: string, kind: string): Context.Context<never> => {
    let byKind = byQueue.get(queue)
    if (byKind === undefined) {
      byKind = new Map()
      byQueue.set(queue, byKind)
    }
    let tagged = byKind.get(kind)
    if (tagged === undefined) {
      tagged = taggedContext({ "awa.queue": queue, "awa.job.kind": kind })
      byKind.set(kind, tagged)
    }
    return tagged
  }
  const others = new Map<string, Context.Context<never>>()
  const by = (attributes: Record<string, string>) => {
    const key = Object.entries(attributes).join("\u0000")
    let tagged = others.get(key)
    if (tagged === undefined) {
      tagged = taggedContext(attributes)
      others.set(key, tagged)
    }
    return tagged
  }
  return {
    enqueued: (queue, kind, count) => jobsEnqueued.updateUnsafe(count, jobContext(queue, kind)),
    claimed: (job) => {
      const tagged = jobContext(job.queue, job.kind)
      jobsClaimed.updateUnsafe(1, tagged)
      const waitedMs = job.claimedAt.getTime() - job.runAt.getTime()
      pickupLatency.updateUnsafe(Math.max(0, waitedMs) / 1000, tagged)
    },
    finished: (job, state, runMs) => {
      const metric = outcomeCounter[state]
      const tagged = jobContext(job.queue, job.kind)
      if (metric !== undefined) metric.updateUnsafe(1, tagged)
      if (runMs !== undefined) handlerDuration.updateUnsafe(runMs / 1000, tagged)
    },
    rescued: (reason, queue, kind) =>
      jobsRescued.updateUnsafe(1, by({ reason, "awa.queue": queue, "awa.job.kind": kind })),
    pruned: (outcome, reason) => prunes.updateUnsafe(1, by({ outcome, reason: reason ?? "" })),
    leading: (leader) => isLeader.updateUnsafe(leader ? 1 : 0, context)
  }
}
