/**
 * Job states (capabilities.md §0). The stored text is snake_case; the bit values form the unique
 * state mask stored with a unique job (a persistent format: never renumber).
 */
export const jobStates = [
  "scheduled",
  "available",
  "running",
  "waiting_external",
  "retryable",
  "completed",
  "failed",
  "cancelled",
  "waiting_on"
] as const

export type JobState = (typeof jobStates)[number]

export const terminalStates: ReadonlyArray<JobState> = ["completed", "failed", "cancelled"]

export const isTerminal = (state: JobState): boolean => terminalStates.includes(state)

/** Persistent bit of each state in a unique-state mask. */
export const stateBit: Readonly<Record<JobState, number>> = {
  scheduled: 1,
  available: 2,
  running: 4,
  waiting_external: 8,
  retryable: 16,
  completed: 32,
  failed: 64,
  cancelled: 128,
  waiting_on: 256
}

export const stateMask = (states: Iterable<JobState>): number => {
  let mask = 0
  for (const state of states) mask |= stateBit[state]
  return mask
}

/** The default unique mask: every live state plus completed (capabilities.md §4). */
export const defaultUniqueStates: ReadonlyArray<JobState> = [
  "scheduled",
  "available",
  "running",
  "waiting_external",
  "retryable",
  "completed"
]

export const maskHas = (mask: number, state: JobState): boolean => (mask & stateBit[state]) !== 0
