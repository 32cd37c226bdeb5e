/**
 * Retry backoff (capabilities.md §3): `2^attempt` seconds plus uniform jitter in [0, 25 %) of that,
 * capped at 24 h. The SQL twin (`:AWA_SCHEMA.backoff_ms`, used by rescue) must give the same
 * bounds; a property test keeps them equal.
 */
export const maxBackoffMs = 24 * 60 * 60 * 1000

/** Lower and upper (exclusive) bounds of the default backoff after `attempt` failed attempts. */
export const backoffBounds = (attempt: number): { readonly min: number; readonly max: number } => {
  const base = Math.min(2 ** attempt * 1000, maxBackoffMs)
  return base >= maxBackoffMs
    ? { min: maxBackoffMs, max: maxBackoffMs }
    : { min: base, max: Math.min(base * 1.25, maxBackoffMs) }
}

/** The default backoff in milliseconds; `random` in [0, 1). */
export const defaultBackoffMs = (attempt: number, random: number): number => {
  const { min, max } = backoffBounds(attempt)
  return Math.floor(min + (max - min) * random)
}

/**
 * Effective priority at claim time (capabilities.md §5): `max(1, priority − floor(waited / interval))`;
 * an interval of 0 disables aging. The claim function in SQL uses the same formula.
 */
export const effectivePriority = (priority: number, waitedMs: number, agingIntervalMs: number): number =>
  agingIntervalMs <= 0
    ? priority
    : Math.max(1, priority - Math.floor(Math.max(0, waitedMs) / agingIntervalMs))
