/**
 * Checks both storage layers run on their inputs before touching state, so Postgres and the
 * simulation reject exactly the same calls with the same `ValidationError`.
 */
import { UnsafeBulkFilter, ValidationError } from "@awa/core"
import { Effect } from "effect"
import type { DlqFilter, FinalizeItem, ListFilter } from "./QueueStorage.ts"

/** Largest delay an outcome may ask for (capabilities.md §3: 0 ms – 30 days). */
export const maxDelayMs = 30 * 24 * 60 * 60 * 1000

/** Longest error message or cancel reason stored (capabilities.md §3: 4 KiB). */
export const maxErrorMessageLength = 4096

/** Largest claim batch. */
export const maxClaimBatch = 100_000

/** Ranges of the queue ring's maintenance policy, shared by the storage layer and the worker. */
export const rotateMinRowsRange = { min: 1, max: 10_000_000, default: 10_000 } as const
export const rotateMaxAgeMsRange = { min: 0, max: 3_600_000, default: 10_000 } as const
export const pruneCarryAfterMsRange = { min: 0, max: 3_600_000, default: 5000 } as const

export const defaultListLimit = 100
export const maxListLimit = 1000

export const checkInteger = (field: string, value: number, min: number, max: number) =>
  Number.isInteger(value) && value >= min && value <= max
    ? Effect.void
    : Effect.fail(new ValidationError({ field, reason: `must be an integer ${min}–${max} (got ${value})` }))

/** Progress, when given, is a JSON object (not an array, not null). */
export const isProgressObject = (progress: unknown): boolean =>
  typeof progress === "object" && progress !== null && !Array.isArray(progress)

/**
 * Delays of retry and snooze outcomes must be whole milliseconds, 0 – 30 days; progress, when
 * given (not `undefined` or `null`), an object.
 */
export const checkFinalizeItems = (
  items: ReadonlyArray<FinalizeItem>
): Effect.Effect<void, ValidationError> =>
  Effect.forEach(
    items,
    (item, i) => {
      if (item.progress != null && !isProgressObject(item.progress))
        return Effect.fail(
          new ValidationError({ field: `items[${i}].progress`, reason: "must be a JSON object" })
        )
      const o = item.outcome
      return o._tag === "Retry" || o._tag === "Snooze"
        ? checkInteger(`items[${i}].delayMs`, o.delayMs, 0, maxDelayMs)
        : Effect.void
    },
    { discard: true }
  )

export const checkListLimit = (filter: ListFilter) =>
  checkInteger("limit", filter.limit ?? defaultListLimit, 1, maxListLimit)

/** Longest DLQ retention a queue may ask for: 3,650 days. */
export const maxDlqRetentionMs = 3650 * 24 * 60 * 60 * 1000

/** Widest `enqueueShards` (capabilities.md §22; claims probe every lane, so cost grows with it). */
export const maxEnqueueShards = 64

export const checkDlqLimit = (filter: DlqFilter) => checkInteger("limit", filter.limit ?? 50, 1, maxListLimit)

/** A bulk DLQ action with no condition at all must say `all: true`. */
export const checkBulkFilter = (
  action: string,
  filter: DlqFilter,
  options: { readonly all?: boolean | undefined }
) => {
  const empty = [filter.queue, filter.kind, filter.tag, filter.since, filter.until, filter.before].every(
    (v) => v === undefined
  )
  return empty && options.all !== true ? Effect.fail(new UnsafeBulkFilter({ action })) : Effect.void
}

/** The `recent` window of `queueStats`: 1 s – 24 h, default 5 minutes. */
export const statsWindowMsRange = { min: 1000, max: 86_400_000, default: 300_000 } as const

export const checkStatsWindow = (windowMs: number | undefined) =>
  checkInteger(
    "windowMs",
    windowMs ?? statsWindowMsRange.default,
    statsWindowMsRange.min,
    statsWindowMsRange.max
  )

/** What `QueueStatsReport.staleness` says on both layers. */
export const statsStaleness =
  "counts: none (one snapshot at asOf); recent: a reclaimed ring slot's finalizations are dated when the slot was reclaimed (up to a rotation interval plus the prune lag late)"
