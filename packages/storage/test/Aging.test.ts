/**
 * Claim-time priority aging (capabilities.md §5): the formula lives in SQL (`claim`, migration
 * 0016) and in TypeScript (`Backoff.effectivePriority`, used by the Sim). A property test keeps
 * them equal through what they decide: for random pairs of lanes (stored priorities, waits, aging
 * interval), the job `claim` takes on Postgres and on the Sim is the one the TypeScript formula
 * orders first (effective priority, then head `runAt`, then stored priority).
 *
 * Waits are whole intervals plus 1, 5 or 9 tenths of one, so the time between computing `runAt`
 * here and the database's `now()` never crosses an interval boundary.
 */
import { Backoff } from "@awa/core"
import { TestDatabase } from "@awa/testing"
import { assert, describe, layer, type Vitest } from "@effect/vitest"
import { Clock, Effect, Layer } from "effect"
import fc from "fast-check"
import { layer as pgLayer } from "../src/PgQueueStorage.ts"
import { QueueStorage } from "../src/QueueStorage.ts"
import * as SimQueueStorage from "../src/SimQueueStorage.ts"
import { fresh } from "./pgFixtures.ts"

/** An hour: a tenth of it (6 min) separates every wait from an interval boundary. */
const intervalMs = 3_600_000

interface Lane {
  readonly priority: number
  /** Whole aging intervals waited. */
  readonly intervals: number
  /** Tenths of an interval waited on top (1, 5 or 9: never near a boundary). */
  readonly tenths: number
}

const lane = (priority: number) =>
  fc.record({
    priority: fc.constant(priority),
    intervals: fc.integer({ min: 0, max: 4 }),
    tenths: fc.constantFrom(1, 5, 9)
  })

// one lane per priority, so every claim order is possible
const cases = fc.sample(
  fc.record({ lanes: fc.tuple(lane(1), lane(2), lane(3), lane(4)), aging: fc.boolean() }),
  {
    numRuns: 50,
    seed: 20261201
  }
)

const suite = (it: Vitest.MethodsNonLive<QueueStorage>) => {
  it.effect("claim takes the lanes' heads in the order the TypeScript aging formula gives", () =>
    Effect.gen(function* () {
      const storage = yield* QueueStorage
      for (const { lanes, aging } of cases) {
        const now = yield* Clock.currentTimeMillis
        const queue = fresh("aging")
        const agingIntervalMs = aging ? intervalMs : 0
        const waited = (l: Lane) => l.intervals * intervalMs + (l.tenths * intervalMs) / 10
        const jobs = yield* storage.enqueueMany(
          lanes.map((l) => ({
            kind: "k",
            queue,
            args: {},
            priority: l.priority,
            runAt: new Date(now - waited(l))
          }))
        )
        // effective priority, then head runAt (the longer wait first), then stored priority
        const rank = (l: Lane) =>
          [Backoff.effectivePriority(l.priority, waited(l), agingIntervalMs), -waited(l), l.priority] as const
        const expected = [0, 1, 2, 3]
          .sort((x, y) => {
            const [p, q] = [rank(lanes[x]!), rank(lanes[y]!)]
            return p[0] - q[0] || p[1] - q[1] || p[2] - q[2]
          })
          .map((i) => jobs[i]!.id)
        const order: Array<bigint> = []
        for (let i = 0; i < 4; i++) {
          const [claimed] = yield* storage.claim({ queue, max: 1, deadlineMs: 0, agingIntervalMs })
          order.push(claimed!.jobId)
        }
        assert.deepStrictEqual(order, expected, JSON.stringify({ lanes, aging }))
      }
    })
  )
}

describe("claim-time aging: SQL and TypeScript agree", () => {
  layer(pgLayer().pipe(Layer.provideMerge(TestDatabase.layer())), {
    excludeTestServices: true,
    timeout: "120 seconds"
  })("on Postgres", suite)
  layer(SimQueueStorage.layer)("on the simulation", suite)
})
