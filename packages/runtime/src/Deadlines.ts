/**
 * Hard deadlines of held attempts, enforced by one fiber. `Effect.timeout` per attempt races two
 * fibers and arms a timer for every job (the largest per-job cost in the drain profile, since
 * every queue has a deadline by default); here an attempt costs one list node.
 *
 * Attempts with the same deadline duration are added in the order they were held, so each
 * duration's list is ordered by expiry and the fiber only looks at list heads: it sleeps until
 * the earliest head expires, fires it, and repeats. Removal (the attempt finished) unlinks its node
 * in O(1). Times come from `Clock`, so `TestClock` drives it in simulations.
 *
 * **Gotchas** If the wall clock steps back between two adds of one duration, the later node may
 * expire before the one ahead of it; it then fires when its predecessor does (late by at most the
 * step), never early.
 */
import { Clock, Effect, Queue } from "effect"

export interface DeadlineNode {
  readonly expiresAt: number
  prev: DeadlineNode | undefined
  next: DeadlineNode | undefined
  list: DeadlineList | undefined
  readonly onExpire: () => Effect.Effect<void>
}

interface DeadlineList {
  head: DeadlineNode | undefined
  tail: DeadlineNode | undefined
}

export interface Deadlines {
  /** Registers `onExpire` to run once at `heldAt + durationMs`, unless removed first. */
  readonly add: (heldAt: number, durationMs: number, onExpire: () => Effect.Effect<void>) => DeadlineNode
  /** Forgets a node; a no-op if it already fired or was removed. */
  readonly remove: (node: DeadlineNode) => void
  /** The enforcing loop; runs until interrupted. */
  readonly run: Effect.Effect<never>
}

export const make = Effect.fnUntraced(function* () {
  const lists = new Map<number, DeadlineList>()
  // Rung when a list gains a new head, which may expire before the loop's current wake-up.
  const bell = yield* Queue.sliding<void>(1)

  const unlink = (node: DeadlineNode) => {
    const list = node.list
    if (list === undefined) return
    if (node.prev === undefined) list.head = node.next
    else node.prev.next = node.next
    if (node.next === undefined) list.tail = node.prev
    else node.next.prev = node.prev
    node.prev = node.next = node.list = undefined
  }

  const add = (heldAt: number, durationMs: number, onExpire: () => Effect.Effect<void>): DeadlineNode => {
    let list = lists.get(durationMs)
    if (list === undefined) {
      list = { head: undefined, tail: undefined }
      lists.set(durationMs, list)
    }
    const node: DeadlineNode = {
      expiresAt: heldAt + durationMs,
      prev: list.tail,
      next: undefined,
      list,
      onExpire
    }
    if (list.tail === undefined) {
      list.head = node
      Queue.offerUnsafe(bell, undefined)
    } else list.tail.next = node
    list.tail = node
    return node
  }

  /** Fires every expired head; returns the earliest expiry still pending. */
  const fireExpired = (now: number) => {
    const expired: Array<DeadlineNode> = []
    let next = Number.POSITIVE_INFINITY
    for (const list of lists.values()) {
      while (list.head !== undefined && list.head.expiresAt <= now) {
        const node = list.head
        unlink(node)
        expired.push(node)
      }
      if (list.head !== undefined) next = Math.min(next, list.head.expiresAt)
    }
    return { expired, next }
  }

  const run = Effect.gen(function* () {
    for (;;) {
      const now = yield* Clock.currentTimeMillis
      const { expired, next } = fireExpired(now)
      for (const node of expired) yield* node.onExpire()
      if (expired.length > 0) continue
      yield* next === Number.POSITIVE_INFINITY
        ? Queue.take(bell)
        : Queue.take(bell).pipe(Effect.timeoutOption(next - now))
    }
  })

  return { add, remove: unlink, run: run as Effect.Effect<never> } satisfies Deadlines
})
