/**
 * Shared pieces of the sampled statistics (migration 0031, docs/adr/0024-operator-surface.md,
 * "Amendment 2026-12-02"): option checks, the staleness text, and counts over a span as rates.
 * Both storage layers use them, so the Postgres and simulated reports read alike.
 */
import { Effect } from "effect"
import type { FinalizedCounts, QueueRates, RatesSpan } from "./QueueStorage.ts"
import { checkInteger } from "./StorageChecks.ts"

export const historyWindowMsRange = { min: 60_000, max: 7_200_000, default: 3_600_000 } as const
export const historyBucketMsRange = { min: 1000, max: 3_600_000, default: 60_000 } as const

export const checkHistoryOptions = (windowMs: number | undefined, bucketMs: number | undefined) =>
  Effect.andThen(
    checkInteger(
      "windowMs",
      windowMs ?? historyWindowMsRange.default,
      historyWindowMsRange.min,
      historyWindowMsRange.max
    ),
    checkInteger(
      "bucketMs",
      bucketMs ?? historyBucketMsRange.default,
      historyBucketMsRange.min,
      historyBucketMsRange.max
    )
  )

/** What the rates add to `QueueStatsReport.staleness`. */
export const ratesStaleness =
  "rates: from the leader's samples (every 15 s by default), as of the last sample; enqueue counts describe the sample period before it"

/** Counts over the span as per-second rates. */
export const toRates = (
  counts: FinalizedCounts & { readonly enqueued: number },
  span: RatesSpan
): QueueRates => {
  const seconds = Math.max(0.001, (span.end.getTime() - span.start.getTime()) / 1000)
  const enqueueSeconds =
    span.enqueueStart === null || span.enqueueEnd === null
      ? seconds
      : Math.max(0.001, (span.enqueueEnd.getTime() - span.enqueueStart.getTime()) / 1000)
  return {
    ...counts,
    enqueuedPerSecond: counts.enqueued / enqueueSeconds,
    completedPerSecond: counts.completed / seconds,
    failedPerSecond: counts.failed / seconds,
    cancelledPerSecond: counts.cancelled / seconds
  }
}
