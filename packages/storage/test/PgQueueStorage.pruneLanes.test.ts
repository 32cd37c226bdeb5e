/**
 * A pruned slot's residue in several lanes (migration 0058): prune finds the lanes with rows in the
 * slot by `ready_lanes_in_slot` (a loose scan of the ready child's primary key for up to 16 lanes,
 * a scan of the child past that). Every lane's unclaimed rows must survive the truncate, carried
 * into the current slot or parked ahead, and come back in their lane's order; a lane the function
 * missed would lose its rows with the slot.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { QueueStorage } from "../src/QueueStorage.ts"
import { claimOf, completeAll, fresh, keepAll, withEagerDatabase } from "./pgFixtures.ts"

/**
 * Three lanes: two queues, one of them with two priorities, and `more` lanes of queues of their
 * own. `claimed`: how many of the lane's head are claimed before the slot is sealed (a queue's
 * claim takes its best priority first, so of queue a only priority 1's head is).
 */
const lanesOf = (label: string, more = 0) => {
  const a = fresh(`${label}-a`)
  const b = fresh(`${label}-b`)
  return [
    { queue: a, priority: 1, claimed: 2 },
    { queue: a, priority: 3, claimed: 0 },
    { queue: b, priority: 2, claimed: 2 },
    ...Array.from({ length: more }, (_, i) => ({
      queue: fresh(`${label}-more${i}`),
      priority: 2,
      claimed: 1
    }))
  ]
}

/**
 * Five jobs in each lane, the lane's `claimed` first claimed and completed (so a cursor is inside
 * the slot), then the slot sealed by a rotation. Returns the unclaimed ids per lane, in the order
 * enqueued.
 */
const sealedResidue = (lanes: ReturnType<typeof lanesOf>) =>
  Effect.gen(function* () {
    const storage = yield* QueueStorage
    const residue: Array<Array<bigint>> = []
    for (const lane of lanes) {
      const ids = yield* storage.enqueueMany(
        Array.from({ length: 5 }, (_, n) => ({
          kind: "lanes",
          queue: lane.queue,
          priority: lane.priority,
          args: { n }
        }))
      )
      residue.push(ids.slice(lane.claimed).map((x) => x.id))
    }
    for (const lane of lanes) {
      if (lane.claimed === 0) continue
      const claimed = yield* storage.claim(claimOf(lane.queue, lane.claimed))
      assert.deepStrictEqual(
        claimed.map((j) => j.priority),
        Array.from({ length: lane.claimed }, () => lane.priority),
        "the claim took the lane's head"
      )
      yield* completeAll(claimed)
    }
    assert.strictEqual(yield* storage.rotate, "Rotated")
    return residue
  })

/** Claims every queue of `lanes` until empty, promoting (unparking) between calls; ids per lane. */
const claimBack = (lanes: ReturnType<typeof lanesOf>) =>
  Effect.gen(function* () {
    const storage = yield* QueueStorage
    const got = lanes.map(() => [] as Array<bigint>)
    for (let round = 0; round < 20; round++) {
      yield* storage.promoteDue(1000)
      for (const queue of new Set(lanes.map((l) => l.queue)))
        for (const job of yield* storage.claim(claimOf(queue, 100)))
          got[lanes.findIndex((l) => l.queue === job.queue && l.priority === job.priority)]!.push(job.jobId)
    }
    return got
  })

/**
 * Seals a slot with residue in three lanes and `moreLanes` more, prunes it with a carry budget of
 * `carryRows`, and claims every row back: each lane's rows, once each, in order.
 */
const residueComesBack = (label: string, carryRows: number, moreLanes = 0) =>
  withEagerDatabase({ pruneCarryRows: carryRows }, () =>
    Effect.gen(function* () {
      const storage = yield* QueueStorage
      const lanes = lanesOf(label, moreLanes)
      const residue = yield* sealedResidue(lanes)
      const outcome = yield* storage.prune(keepAll)
      assert.strictEqual(outcome._tag, "Pruned")
      assert.deepStrictEqual(yield* claimBack(lanes), residue, "each lane's rows, once each, in order")
    })
  )

describe("prune: a slot's residue in several lanes", () => {
  it.live("carries every lane's unclaimed rows into the current slot, in order", () =>
    residueComesBack("carry", 100)
  )

  // eleven rows of residue against a budget of one: the park-ahead step (more than twice the
  // budget), which locks each lane of the slot and parks what will not be carried
  it.live("parks ahead every lane's rows beyond the carry budget, and loses none", () =>
    residueComesBack("park", 1)
  )

  // more lanes than ready_lanes_in_slot walks (16): it answers by a scan of the slot instead
  it.live("finds every lane of a slot with more lanes than the walk takes", () =>
    residueComesBack("many", 100, 20)
  )
})
