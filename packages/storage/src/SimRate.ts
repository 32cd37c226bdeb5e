/**
 * The simulation's fleet-rate state (GCRA, as claim_rated and claim_keyed_rated, migrations 0043
 * and 0045): one `tat` per queue, in seconds on the simulation's clock, shared by the plain rated
 * claim (`FlowStorage.layerSim`) and the keyed one (`SimKeyGrants`) over the same
 * `SimQueueStorage`, as both SQL functions share the queue's `rate_marks`. One lock around a rated
 * claim's read of `tat`, its claim and its write, as the SQL's advisory lock: a claim between
 * them can yield to another claimer's fiber.
 */
import { Semaphore } from "effect"
import type { FleetRate } from "./FlowStorage.ts"

export interface SimRateState {
  readonly tats: Map<string, number>
  readonly lock: Semaphore.Semaphore
}

const states = new WeakMap<object, SimRateState>()

/** The rate state of the simulation whose `QueueStorage` service is `storage`. */
export const stateOf = (storage: object): SimRateState => {
  let state = states.get(storage)
  if (state === undefined) {
    state = { tats: new Map(), lock: Semaphore.makeUnsafe(1) }
    states.set(storage, state)
  }
  return state
}

/** What GCRA allows at time `t` (seconds) given the queue's `tat` (undefined: never claimed). */
export interface Allowance {
  readonly tokens: number
  /** tat's base for this claim: max(tat, t). */
  readonly base: number
  readonly period: number
  readonly burst: number
  /** With no token: when the next one is due (seconds). */
  readonly nextAt: number
}

export const allowance = (rate: FleetRate, tat: number | undefined, t: number): Allowance => {
  const period = 1 / rate.maxRate
  const burst = rate.burst === 0 ? Math.max(1, Math.ceil(rate.maxRate)) : rate.burst
  const base = Math.max(tat ?? t, t)
  const tokens = Math.min(burst, Math.floor((t + burst * period - base) / period + 1e-9))
  return { tokens, base, period, burst, nextAt: base - burst * period + period }
}

/** When the next token is due once `taken` tokens of the allowance are spent (seconds). */
export const nextTokenAfter = (a: Allowance, taken: number): number =>
  a.base + (taken - a.burst + 1) * a.period
