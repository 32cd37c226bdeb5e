/**
 * Per-queue rate limiting (capabilities.md §12; docs/adr/0028-flow-control.md): a token bucket
 * per queue per worker process, shared by that queue's claims in the process.
 *
 * The bucket starts full (`burst` tokens) and refills continuously at `maxRate` tokens a second,
 * measured on the `Clock` the dispatcher passes in (so `TestClock` drives it in tests). A claim
 * takes whole tokens first, at most what it wants; the tokens it did not use (the claim returned
 * fewer rows, or failed) are refunded. So over any window of T seconds at most
 * `burst + maxRate × T` jobs of the queue start in this process.
 *
 * **Per process** N processes admit up to N × `maxRate`: there is no fleet-wide limiter (the ADR
 * says why). The limiter is plain state read and written between fiber yields on the one JS thread.
 */

export interface RateLimit {
  /** Jobs per second, > 0 and ≤ 100,000. */
  readonly maxRate: number
  /** Bucket size (integer ≥ 0); 0 means `max(1, ceil(maxRate))`. */
  readonly burst: number
}

export const maxRateLimit = 100_000

/** Why `limit` is not valid, or undefined when it is. */
export const invalidReason = (limit: {
  readonly maxRate: unknown
  readonly burst?: unknown
}): string | undefined => {
  const { maxRate, burst } = limit
  if (typeof maxRate !== "number" || !(maxRate > 0 && maxRate <= maxRateLimit))
    return `maxRate must be a number > 0 and ≤ ${maxRateLimit}`
  if (
    burst !== undefined &&
    !(typeof burst === "number" && Number.isInteger(burst) && burst >= 0 && burst <= 1e9)
  )
    return "burst must be an integer ≥ 0 (0: max(1, ceil(maxRate)))"
  return undefined
}

/** The bucket size `burst` stands for. */
export const bucketSize = (limit: RateLimit) =>
  limit.burst === 0 ? Math.max(1, Math.ceil(limit.maxRate)) : limit.burst

export interface RateLimiter {
  /** Takes up to `wanted` whole tokens now; returns how many (0 when the bucket holds less than one). */
  readonly take: (wanted: number, nowMs: number) => number
  /** Gives back tokens a claim did not use. */
  readonly refund: (tokens: number) => void
  /** Milliseconds until one whole token is available (0 when one is). */
  readonly msUntilToken: (nowMs: number) => number
  /** Replaces the rate and bucket size (a hot override); the tokens held are kept, up to the new size. */
  readonly retune: (limit: RateLimit, nowMs: number) => void
  readonly current: () => RateLimit
}

export const make = (initial: RateLimit, nowMs: number): RateLimiter => {
  let limit = initial
  let size = bucketSize(limit)
  let tokens = size
  let at = nowMs

  const refill = (now: number) => {
    if (now > at) {
      tokens = Math.min(size, tokens + ((now - at) * limit.maxRate) / 1000)
      at = now
    }
  }

  return {
    take: (wanted, now) => {
      refill(now)
      const granted = Math.max(0, Math.min(Math.floor(wanted), Math.floor(tokens)))
      tokens -= granted
      return granted
    },
    refund: (n) => {
      if (n > 0) tokens = Math.min(size, tokens + n)
    },
    msUntilToken: (now) => {
      refill(now)
      return tokens >= 1 ? 0 : ((1 - tokens) * 1000) / limit.maxRate
    },
    retune: (next, now) => {
      refill(now)
      limit = next
      size = bucketSize(next)
      tokens = Math.min(tokens, size)
    },
    current: () => limit
  }
}
