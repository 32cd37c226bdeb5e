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
 * when the recorder was made): a map lookup for the instrument tagged with the job's queue and
 * kind, then the update. No fiber, no allocation once a (queue, kind) pair has been seen.
 */
import type { JobState } from "@awa/core"
import type { ClaimedJob } from "@awa/storage"
import { type Context, Effect, Metric } from "effect"

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
  const tagged = new Map<string, Metric.Metric<number, unknown>>()
  const byJob = (metric: Metric.Metric<number, unknown>, queue: string, kind: string) => {
    const key = `${metric.id}\u0000${queue}\u0000${kind}`
    let m = tagged.get(key)
    if (m === undefined) {
      m = metric.pipe(Metric.withAttributes({ "awa.queue": queue, "awa.job.kind": kind }))
      tagged.set(key, m)
    }
    return m
  }
  const by = (metric: Metric.Metric<number, unknown>, attributes: Record<string, string>) => {
    const key = `${metric.id}\u0000${Object.entries(attributes).join("\u0000")}`
    let m = tagged.get(key)
    if (m === undefined) {
      m = metric.pipe(Metric.withAttributes(attributes))
      tagged.set(key, m)
    }
    return m
  }
  return {
    enqueued: (queue, kind, count) => byJob(jobsEnqueued, queue, kind).updateUnsafe(count, context),
    claimed: (job) => {
      byJob(jobsClaimed, job.queue, job.kind).updateUnsafe(1, context)
      const waitedMs = job.claimedAt.getTime() - job.runAt.getTime()
      byJob(pickupLatency, job.queue, job.kind).updateUnsafe(Math.max(0, waitedMs) / 1000, context)
    },
    finished: (job, state, runMs) => {
      const metric = outcomeCounter[state]
      if (metric !== undefined) byJob(metric, job.queue, job.kind).updateUnsafe(1, context)
      if (runMs !== undefined) byJob(handlerDuration, job.queue, job.kind).updateUnsafe(runMs / 1000, context)
    },
    rescued: (reason, queue, kind) =>
      by(jobsRescued, { reason, "awa.queue": queue, "awa.job.kind": kind }).updateUnsafe(1, context),
    pruned: (outcome, reason) => by(prunes, { outcome, reason: reason ?? "" }).updateUnsafe(1, context),
    leading: (leader) => isLeader.updateUnsafe(leader ? 1 : 0, context)
  }
}
