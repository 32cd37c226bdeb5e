/**
 * Weighted concurrency (capabilities.md §13; docs/adr/0028-flow-control.md): one pool of
 * `globalMaxWorkers` permits shared by a worker's queues, each with a guaranteed floor
 * (`minWorkers`) and a `weight` for the rest.
 *
 * A permit stands for one claimed attempt of this process, from before its claim until its
 * handler is done (or it is given back unstarted): buffered (claimed-ahead) jobs hold permits
 * too, so the pool bounds the attempts this process holds, not only the handlers running.
 *
 * **Allocation** overflow = global − Σ floors. A queue takes from its own floor first, then from
 * the overflow at most `ceil(overflow × weight / Σ weights of the queues with demand or
 * holdings) − its overflow held`, and never more than the overflow still free. A queue has
 * demand from the moment it asks until a claim of its comes back empty; so an idle queue's
 * share goes to the loaded ones, and comes back as soon as it asks again and the others
 * release (each released permit is re-requested under the new shares).
 *
 * **Guarantees** Σ held ≤ global at every instant; each queue's floor is always available to it.
 * Plain state on the JS thread; releases ring every queue's bell so waiters re-ask.
 */
import { Effect, Queue } from "effect"

export interface QueueWeight {
  readonly queue: string
  /** Permits reserved for this queue (0 – global). */
  readonly minWorkers: number
  /** Share of the overflow, 1–1,000. */
  readonly weight: number
}

export interface QueueHolding {
  readonly queue: string
  readonly minWorkers: number
  readonly weight: number
  readonly held: number
  readonly overflowHeld: number
  readonly demand: boolean
}

export interface PoolSnapshot {
  readonly mode: "weighted"
  readonly globalMaxWorkers: number
  readonly overflow: number
  readonly overflowHeld: number
  readonly queues: ReadonlyArray<QueueHolding>
}

/** One queue's handle on the pool. */
export interface QueueShare {
  /** Takes up to `wanted` permits now (never waits); marks the queue as having demand. */
  readonly acquire: (wanted: number) => number
  /** Gives permits back and wakes every queue waiting for some. */
  readonly release: (n: number) => Effect.Effect<void>
  /** A claim came back empty: the queue stops counting towards the shares until it asks again. */
  readonly idle: () => void
  /** Resolves when permits may have been freed since the last call. */
  readonly changed: Effect.Effect<void>
}

export interface Pool {
  readonly share: (queue: string) => QueueShare
  readonly snapshot: () => PoolSnapshot
}

interface State {
  readonly weight: QueueWeight
  floorHeld: number
  overflowHeld: number
  demand: boolean
  readonly bell: Queue.Queue<void>
}

export const make = (globalMaxWorkers: number, queues: ReadonlyArray<QueueWeight>) =>
  Effect.gen(function* () {
    const overflow = globalMaxWorkers - queues.reduce((sum, q) => sum + q.minWorkers, 0)
    const states = new Map<string, State>()
    for (const weight of queues) {
      // sliding, capacity 1: many releases while the queue is busy collapse into one wake-up
      const bell = yield* Queue.sliding<void>(1)
      states.set(weight.queue, { weight, floorHeld: 0, overflowHeld: 0, demand: false, bell })
    }
    let overflowHeld = 0

    const fairShare = (state: State) => {
      let active = 0
      for (const s of states.values())
        if (s.demand || s.overflowHeld > 0 || s === state) active += s.weight.weight
      return Math.ceil((overflow * state.weight.weight) / active)
    }

    const share = (queue: string): QueueShare => {
      const state = states.get(queue)
      if (state === undefined) throw new Error(`ConcurrencyPermits: queue ${queue} is not in the pool`)
      return {
        acquire: (wanted) => {
          if (wanted <= 0) return 0
          state.demand = true
          const fromFloor = Math.min(wanted, state.weight.minWorkers - state.floorHeld)
          state.floorHeld += fromFloor
          const room = Math.min(overflow - overflowHeld, fairShare(state) - state.overflowHeld)
          const fromOverflow = Math.max(0, Math.min(wanted - fromFloor, room))
          state.overflowHeld += fromOverflow
          overflowHeld += fromOverflow
          return fromFloor + fromOverflow
        },
        release: (n) =>
          Effect.suspend(() => {
            if (n <= 0) return Effect.void
            // overflow first: the floor is this queue's own, the overflow is what others wait for
            const fromOverflow = Math.min(n, state.overflowHeld)
            state.overflowHeld -= fromOverflow
            overflowHeld -= fromOverflow
            state.floorHeld = Math.max(0, state.floorHeld - (n - fromOverflow))
            return Effect.forEach(states.values(), (s) => Queue.offer(s.bell, undefined), { discard: true })
          }),
        idle: () => {
          state.demand = false
        },
        changed: Queue.take(state.bell)
      }
    }

    const snapshot = (): PoolSnapshot => ({
      mode: "weighted",
      globalMaxWorkers,
      overflow,
      overflowHeld,
      queues: [...states.values()].map((s) => ({
        queue: s.weight.queue,
        minWorkers: s.weight.minWorkers,
        weight: s.weight.weight,
        held: s.floorHeld + s.overflowHeld,
        overflowHeld: s.overflowHeld,
        demand: s.demand
      }))
    })

    return { share, snapshot } satisfies Pool
  })
