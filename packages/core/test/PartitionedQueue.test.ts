/**
 * PartitionedQueue (capabilities.md §22): names, routing, the worker entry, and bad input.
 * Routing through real shards (partitions × shards reach every lane) is in
 * packages/runtime/test/PartitionedQueue.pg.test.ts.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect, Exit } from "effect"
import { ValidationError } from "../src/AwaError.ts"
import * as PartitionedQueue from "../src/PartitionedQueue.ts"

describe("PartitionedQueue", () => {
  it.effect("names the partitions logical, logical__p1, …", () =>
    Effect.gen(function* () {
      const pq = yield* PartitionedQueue.make("orders", 4)
      assert.deepStrictEqual(pq.queues, ["orders", "orders__p1", "orders__p2", "orders__p3"])
      const one = yield* PartitionedQueue.make("solo", 1)
      assert.deepStrictEqual(one.queues, ["solo"])
      assert.deepStrictEqual(one.routeByKey("anything"), { queue: "solo", orderingKey: "anything" })
    })
  )

  it.effect("routes a key to one partition, always the same, and keeps it as ordering key", () =>
    Effect.gen(function* () {
      const pq = yield* PartitionedQueue.make("orders", 8)
      const seen = new Map<string, number>()
      for (let i = 0; i < 2_000; i++) {
        const key = `tenant-${i}`
        const route = pq.routeByKey(key)
        assert.strictEqual(route.orderingKey, key)
        assert.strictEqual(route.queue, pq.queues[pq.partitionOf(key)])
        assert.deepStrictEqual(pq.routeByKey(key), route, "deterministic")
        seen.set(route.queue, (seen.get(route.queue) ?? 0) + 1)
      }
      // 2,000 keys over 8 partitions: every partition, none with more than twice its share
      assert.strictEqual(seen.size, 8)
      for (const n of seen.values()) assert.isBelow(n, 500)
      // a persistent format: producers and workers of different versions must agree
      assert.deepStrictEqual(
        ["a", "tenant-1", "ü"].map((k) => PartitionedQueue.partitionOfKey(k, 256)),
        [152, 177, 53]
      )
    })
  )

  it.effect("routes by index modulo the count, negative indices too", () =>
    Effect.gen(function* () {
      const pq = yield* PartitionedQueue.make("q", 3)
      assert.deepStrictEqual(
        [0, 1, 2, 3, 7, -1].map((i) => pq.routeByIndex(i).queue),
        ["q", "q__p1", "q__p2", "q", "q__p1", "q__p2"]
      )
      assert.throws(() => pq.routeByIndex(1.5), RangeError)
    })
  )

  it.effect("gives a worker entry per partition with the same config", () =>
    Effect.gen(function* () {
      const pq = yield* PartitionedQueue.make("q", 2)
      assert.deepStrictEqual(pq.workerQueues({ maxConcurrency: 5 }), {
        q: { maxConcurrency: 5 },
        q__p1: { maxConcurrency: 5 }
      })
    })
  )

  it.effect("rejects bad input with a ValidationError", () =>
    Effect.gen(function* () {
      const failures: Array<[string, number, string]> = [
        ["orders", 0, "partitions"],
        ["orders", 257, "partitions"],
        ["orders", 2.5, "partitions"],
        ["orders", Number.NaN, "partitions"],
        ["", 2, "queue"],
        [" orders", 2, "queue"],
        ["a".repeat(195), 256, "queue"]
      ]
      for (const [logical, n, field] of failures) {
        const exit = yield* Effect.exit(PartitionedQueue.make(logical, n))
        assert.isTrue(Exit.isFailure(exit), `${JSON.stringify(logical)} × ${n}`)
        const error = Exit.isFailure(exit) ? exit.cause : undefined
        assert.include(String(error), field)
        assert.throws(() => PartitionedQueue.makeUnsafe(logical, n), ValidationError)
      }
      // the longest name that fits: 194 characters + "__p255"
      const fits = yield* PartitionedQueue.make("a".repeat(194), 256)
      assert.strictEqual(fits.queues[255]!.length, 200)
    })
  )
})
