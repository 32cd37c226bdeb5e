/**
 * Backpressure at insert (capabilities.md §25; docs/adr/0028-flow-control.md): a producer sees
 * its queue's depth (`signal`) or is refused once the depth reaches a limit (`reject`).
 *
 * **Depth** The capped count of storage-engine.md §9 (`FlowStorage.depth`, SQL `queue_depth`):
 * claimable jobs counted up to a cap, so its cost is bounded by the cap, never the backlog.
 * `signal` counts up to 100,000; `reject` up to its limit. Each answer is cached per client
 * (per process) for at most 1 s and reused by any later check it can answer: an exact count (not
 * capped) answers every cap, a capped one every cap up to its own.
 *
 * **Reject** `depth ≥ limit` ⇒ `BackpressureRejected { queue, depth, limit }` before the insert
 * writes anything; a batch is admitted or refused whole. The reading may be up to 1 s old, so a
 * queue can overshoot its limit by what the fleet enqueues in that second.
 */
import { BackpressureRejected, type Job, ValidationError } from "@awa/core"
import type { FlowStorage } from "@awa/storage"
import { Clock, Effect } from "effect"
import type { SqlError } from "effect/sql"
import type { FlowRecorder } from "./FlowMetrics.ts"

/** What `signal` adds to an insert's result. */
export interface Pressure {
  readonly queue: string
  /** Claimable jobs of the queue, counted up to 100,000 (`capped`: at least that many). */
  readonly depth: number
  readonly capped: boolean
}

/** The cap of a `signal` count (storage-engine.md §9's default). */
export const signalCap = 100_000
export const limitRange = { min: 1, max: 1_000_000 } as const
/** Longest a depth reading is reused. */
export const cacheMs = 1000

interface Reading {
  readonly count: number
  readonly capped: boolean
  readonly at: number
}

export interface Checker {
  /**
   * Applies `mode` for an insert into `queue`: `undefined` for "off" (no query), the pressure for
   * "signal"; fails for "reject" at the limit, or for a malformed mode.
   */
  readonly check: (
    queue: string,
    mode: Job.Backpressure | undefined
  ) => Effect.Effect<Pressure | undefined, BackpressureRejected | ValidationError | SqlError.SqlError>
}

/** Why `mode` is malformed, or undefined. */
const invalid = (mode: unknown): string | undefined => {
  if (mode === undefined || mode === "off" || mode === "signal") return undefined
  if (typeof mode === "object" && mode !== null && "reject" in mode) {
    const limit = (mode as { reject?: { limit?: unknown } }).reject?.limit
    if (
      typeof limit === "number" &&
      Number.isInteger(limit) &&
      limit >= limitRange.min &&
      limit <= limitRange.max
    )
      return undefined
    return `reject.limit must be an integer ${limitRange.min}–${limitRange.max}`
  }
  return `must be "off", "signal" or { reject: { limit } }`
}

export const make = (flow: FlowStorage.FlowStorage["Service"], metrics: FlowRecorder): Checker => {
  const cache = new Map<string, Reading>()

  /** The depth up to `cap`, from a reading of the last second when one answers it. */
  const depth = (queue: string, cap: number) =>
    Effect.flatMap(Clock.currentTimeMillis, (now) => {
      const cached = cache.get(queue)
      if (cached !== undefined && now - cached.at <= cacheMs && (!cached.capped || cached.count >= cap))
        return Effect.succeed({ count: Math.min(cached.count, cap), capped: cached.count >= cap })
      return Effect.map(flow.depth(queue, cap), (d) => {
        cache.set(queue, { count: d.count, capped: d.capped, at: now })
        return d
      })
    })

  return {
    check: (queue, mode) => {
      if (mode === undefined || mode === "off") return Effect.succeed(undefined)
      const reason = invalid(mode)
      if (reason !== undefined) return Effect.fail(new ValidationError({ field: "backpressure", reason }))
      if (mode === "signal")
        return Effect.map(depth(queue, signalCap), (d) => {
          metrics.signaled(queue)
          return { queue, depth: d.count, capped: d.capped }
        })
      const limit = mode.reject.limit
      return Effect.flatMap(depth(queue, limit), (d) => {
        if (d.count < limit) return Effect.succeed(undefined)
        metrics.rejected(queue)
        return Effect.fail(new BackpressureRejected({ queue, depth: d.count, limit }))
      })
    }
  }
}
