/**
 * Hot queue overrides (capabilities.md §13; docs/adr/0028-flow-control.md): retune a live queue's
 * `pollInterval`, `claimBatchSize`, `rateLimit`, `fleetRateLimit` and `deadline` without a deploy.
 *
 * They live in the database (`queue_meta.overrides`, migration 0032), so every process of the
 * fleet sees the same set: `set` replaces the queue's whole set, `clear` removes it. A worker
 * re-reads the overrides of its queues once per `overrideRefreshInterval` (one query per worker,
 * never per poll) and applies them to what its dispatchers read on their next claim; a value not
 * set (or cleared) reverts to the one in the code.
 *
 * **Bad values** `validate` refuses an out-of-range value with a `ValidationError` before anything
 * is written. A value written around it in SQL is logged by each worker and ignored (the code's
 * value stays in force); the other fields of the set still apply.
 *
 * **Rate overrides retune, they do not create** A queue declared without `rateLimit` has no
 * limiter in the process; a `rateLimit` override for it is ignored with a warning (so an
 * override can never make an unlimited queue slow by surprise; declare a limit to retune it).
 * The same holds for `fleetRateLimit` (docs/adr/0036-fleet-rate-limit.md): it retunes the
 * fleet-wide limit of a queue declared with one, on every process at its next refresh; the limit's
 * state (the marks) is shared whatever the values, so the new rate applies from the next claim.
 */
import { ValidationError } from "@awa/core"
import { FlowStorage } from "@awa/storage"
import { Clock, Duration, Effect } from "effect"
import * as RateLimiter from "./RateLimiter.ts"

/** What a caller may set; every field optional. */
export interface QueueOverridesInput {
  /** Claim at least this often without a wake-up: 10 ms – 1 min. */
  readonly pollInterval?: Duration.Input | undefined
  /** Most jobs one claim takes: 1–10,000. */
  readonly claimBatchSize?: number | undefined
  /** Retunes the queue's rate limit (a queue without one ignores it, with a warning). */
  readonly rateLimit?: { readonly maxRate: number; readonly burst?: number | undefined } | undefined
  /** Hard deadline per attempt: 0 (none) or 10 ms – 7 days. */
  readonly deadline?: Duration.Input | undefined
  /** Retunes the queue's fleet-wide rate limit (a queue without one ignores it, with a warning). */
  readonly fleetRateLimit?: { readonly maxRate: number; readonly burst?: number | undefined } | undefined
}

/** Overrides as stored and as applied: durations in milliseconds. */
export interface QueueOverrides {
  readonly pollIntervalMs?: number | undefined
  readonly claimBatchSize?: number | undefined
  readonly rateLimit?: RateLimiter.RateLimit | undefined
  readonly deadlineMs?: number | undefined
  readonly fleetRateLimit?: FlowStorage.FleetRate | undefined
}

export interface QueueOverridesView {
  readonly queue: string
  /** The valid fields, as every worker applies them. */
  readonly overrides: QueueOverrides
  /** Fields stored with a value outside their range (written around the API), ignored by workers. */
  readonly invalid: ReadonlyArray<{ readonly field: string; readonly reason: string }>
  readonly updatedAt: Date
}

const day = 86_400_000
export const ranges = {
  pollIntervalMs: { min: 10, max: 60_000 },
  claimBatchSize: { min: 1, max: 10_000 },
  deadlineMs: { min: 10, max: 7 * day }
} as const

const pollReason = `must be ${ranges.pollIntervalMs.min} ms – ${ranges.pollIntervalMs.max} ms`
const batchReason = `must be an integer ${ranges.claimBatchSize.min}–${ranges.claimBatchSize.max}`
const deadlineReason = `must be 0 or ${ranges.deadlineMs.min} ms – ${ranges.deadlineMs.max} ms`

const isPoll = (ms: unknown): ms is number =>
  typeof ms === "number" &&
  Number.isInteger(ms) &&
  ms >= ranges.pollIntervalMs.min &&
  ms <= ranges.pollIntervalMs.max
const isBatch = (n: unknown): n is number =>
  typeof n === "number" &&
  Number.isInteger(n) &&
  n >= ranges.claimBatchSize.min &&
  n <= ranges.claimBatchSize.max
/** Why a fleet rate is out of range (as the worker option's), or undefined. */
const fleetRateReason = (limit: { readonly maxRate: unknown; readonly burst?: unknown }) =>
  RateLimiter.invalidReason(limit) ??
  (typeof limit.burst === "number" && limit.burst > FlowStorage.fleetRateLimits.maxBurst
    ? `burst must be at most ${FlowStorage.fleetRateLimits.maxBurst}`
    : undefined)

const isDeadline = (ms: unknown): ms is number =>
  typeof ms === "number" &&
  Number.isInteger(ms) &&
  (ms === 0 || (ms >= ranges.deadlineMs.min && ms <= ranges.deadlineMs.max))

const toMs = (input: Duration.Input): number => {
  const decoded = Duration.fromInput(input)
  return decoded._tag === "Some" ? Duration.toMillis(decoded.value) : Number.NaN
}

/** Checks a caller's overrides; the stored form, or a `ValidationError` naming the first bad field. */
export const validate = (input: QueueOverridesInput): Effect.Effect<QueueOverrides, ValidationError> =>
  Effect.suspend(() => {
    const fail = (field: string, reason: string) => Effect.fail(new ValidationError({ field, reason }))
    if (typeof input !== "object" || input === null) return fail("overrides", "must be an object")
    const known = new Set(["pollInterval", "claimBatchSize", "rateLimit", "deadline", "fleetRateLimit"])
    for (const key of Object.keys(input))
      if (!known.has(key))
        return fail(
          key,
          "is not an override (pollInterval, claimBatchSize, rateLimit, deadline, fleetRateLimit)"
        )
    const out: { -readonly [K in keyof QueueOverrides]: QueueOverrides[K] } = {}
    if (input.pollInterval !== undefined) {
      const ms = toMs(input.pollInterval)
      if (!isPoll(ms)) return fail("pollInterval", pollReason)
      out.pollIntervalMs = ms
    }
    if (input.claimBatchSize !== undefined) {
      if (!isBatch(input.claimBatchSize)) return fail("claimBatchSize", batchReason)
      out.claimBatchSize = input.claimBatchSize
    }
    if (input.rateLimit !== undefined) {
      const reason =
        typeof input.rateLimit === "object" ? RateLimiter.invalidReason(input.rateLimit) : "must be an object"
      if (reason !== undefined) return fail("rateLimit", reason)
      out.rateLimit = { maxRate: input.rateLimit.maxRate, burst: input.rateLimit.burst ?? 0 }
    }
    if (input.deadline !== undefined) {
      const ms = toMs(input.deadline)
      if (!isDeadline(ms)) return fail("deadline", deadlineReason)
      out.deadlineMs = ms
    }
    if (input.fleetRateLimit !== undefined) {
      const reason =
        typeof input.fleetRateLimit === "object" ? fleetRateReason(input.fleetRateLimit) : "must be an object"
      if (reason !== undefined) return fail("fleetRateLimit", reason)
      out.fleetRateLimit = { maxRate: input.fleetRateLimit.maxRate, burst: input.fleetRateLimit.burst ?? 0 }
    }
    return Effect.succeed(out)
  })

/** Reads a stored set field by field: the valid fields, and what was wrong with the others. */
export const decodeStored = (
  stored: Readonly<Record<string, unknown>>
): { readonly overrides: QueueOverrides; readonly invalid: Array<{ field: string; reason: string }> } => {
  const invalid: Array<{ field: string; reason: string }> = []
  const out: { -readonly [K in keyof QueueOverrides]: QueueOverrides[K] } = {}
  for (const [field, value] of Object.entries(stored)) {
    if (value === null || value === undefined) continue
    if (field === "pollIntervalMs") {
      if (isPoll(value)) out.pollIntervalMs = value
      else invalid.push({ field, reason: pollReason })
    } else if (field === "claimBatchSize") {
      if (isBatch(value)) out.claimBatchSize = value
      else invalid.push({ field, reason: batchReason })
    } else if (field === "deadlineMs") {
      if (isDeadline(value)) out.deadlineMs = value
      else invalid.push({ field, reason: deadlineReason })
    } else if (field === "rateLimit") {
      const r = value as { maxRate?: unknown; burst?: unknown }
      const reason =
        typeof value === "object"
          ? RateLimiter.invalidReason({ maxRate: r.maxRate, burst: r.burst })
          : "must be an object"
      if (reason === undefined)
        out.rateLimit = { maxRate: r.maxRate as number, burst: (r.burst as number | undefined) ?? 0 }
      else invalid.push({ field, reason })
    } else if (field === "fleetRateLimit") {
      const r = value as { maxRate?: unknown; burst?: unknown }
      const reason =
        typeof value === "object"
          ? fleetRateReason({ maxRate: r.maxRate, burst: r.burst })
          : "must be an object"
      if (reason === undefined)
        out.fleetRateLimit = { maxRate: r.maxRate as number, burst: (r.burst as number | undefined) ?? 0 }
      else invalid.push({ field, reason })
    } else invalid.push({ field, reason: "is not an override" })
  }
  return { overrides: out, invalid }
}

/** Stored overrides of the given queues (all queues with some when unset), decoded. */
export const get = (queues?: ReadonlyArray<string>) =>
  Effect.flatMap(FlowStorage.FlowStorage, (flow) =>
    Effect.map(flow.getOverrides(queues), (rows) =>
      rows.map(
        (row): QueueOverridesView => ({
          queue: row.queue,
          ...decodeStored(row.overrides),
          updatedAt: row.updatedAt
        })
      )
    )
  )

/** Validates and stores `input` as the queue's whole override set. */
export const set = (queue: string, input: QueueOverridesInput) =>
  Effect.gen(function* () {
    const flow = yield* FlowStorage.FlowStorage
    const overrides = yield* validate(input)
    yield* flow.setOverrides(queue, { ...overrides })
    return overrides
  })

/** Removes the queue's overrides; true when it had some. */
export const clear = (queue: string) =>
  Effect.flatMap(FlowStorage.FlowStorage, (flow) => flow.clearOverrides(queue))

// ---------------------------------------------------------------------------------------------
// Applying overrides in a worker

/** What one queue's dispatcher reads on each claim: the code's values, or an override's. */
export interface LiveSettings {
  pollIntervalMs: number
  claimBatchSize: number | undefined
  deadlineMs: number
  readonly limiter: RateLimiter.RateLimiter | undefined
  /** The fleet-wide rate each rated claim applies (undefined: the queue has none). */
  fleetRate: FlowStorage.FleetRate | undefined
}

export interface QueueBase {
  readonly queue: string
  readonly pollIntervalMs: number
  readonly claimBatchSize: number | undefined
  readonly deadlineMs: number
  readonly rateLimit: RateLimiter.RateLimit | undefined
  readonly fleetRate?: FlowStorage.FleetRate | undefined
}

export const liveSettings = (base: QueueBase, nowMs: number): LiveSettings => ({
  pollIntervalMs: base.pollIntervalMs,
  claimBatchSize: base.claimBatchSize,
  deadlineMs: base.deadlineMs,
  limiter: base.rateLimit === undefined ? undefined : RateLimiter.make(base.rateLimit, nowMs),
  fleetRate: base.fleetRate
})

const sameLimit = (a: RateLimiter.RateLimit, b: RateLimiter.RateLimit) =>
  a.maxRate === b.maxRate && a.burst === b.burst

/**
 * Applies one queue's stored set (undefined: none) to its live settings; logs what it ignores.
 * `reported` remembers what was already logged, so a bad value is reported once per change.
 */
export const apply = (
  base: QueueBase,
  live: LiveSettings,
  stored: Readonly<Record<string, unknown>> | undefined,
  reported: Map<string, string>
) =>
  Effect.gen(function* () {
    const { overrides, invalid } =
      stored === undefined ? { overrides: {} as QueueOverrides, invalid: [] } : decodeStored(stored)
    const warnings: Array<string> = invalid.map(
      (i) => `override ${i.field} of queue ${base.queue} ignored: ${i.reason}`
    )
    live.pollIntervalMs = overrides.pollIntervalMs ?? base.pollIntervalMs
    live.claimBatchSize = overrides.claimBatchSize ?? base.claimBatchSize
    live.deadlineMs = overrides.deadlineMs ?? base.deadlineMs
    if (overrides.rateLimit !== undefined && live.limiter === undefined)
      warnings.push(
        `rateLimit override of queue ${base.queue} ignored: the queue has no rateLimit in this process (an override retunes a limit, it cannot create one)`
      )
    if (live.limiter !== undefined) {
      const wanted = overrides.rateLimit ?? base.rateLimit!
      if (!sameLimit(wanted, live.limiter.current()))
        live.limiter.retune(wanted, yield* Clock.currentTimeMillis)
    }
    if (overrides.fleetRateLimit !== undefined && base.fleetRate === undefined)
      warnings.push(
        `fleetRateLimit override of queue ${base.queue} ignored: the queue has no fleetRateLimit in this process (an override retunes a limit, it cannot create one)`
      )
    if (base.fleetRate !== undefined) live.fleetRate = overrides.fleetRateLimit ?? base.fleetRate
    const text = warnings.join("; ")
    if (text !== (reported.get(base.queue) ?? "")) {
      reported.set(base.queue, text)
      if (text !== "") yield* Effect.logWarning(text)
    }
  })

/** Reads the overrides of `bases`' queues once and applies them (a failed read keeps what applies). */
export const refresh = (
  bases: ReadonlyArray<{ readonly base: QueueBase; readonly live: LiveSettings }>,
  reported: Map<string, string>
) =>
  Effect.gen(function* () {
    const flow = yield* FlowStorage.FlowStorage
    const rows = yield* flow.getOverrides(bases.map((b) => b.base.queue))
    const byQueue = new Map(rows.map((r) => [r.queue, r.overrides]))
    for (const { base, live } of bases) yield* apply(base, live, byQueue.get(base.queue), reported)
  })
