/**
 * Partitioned queues on Postgres (capabilities.md §22, ADR 0035): with 4 partitions of 4 shards
 * each, keyed traffic reaches every shard of every partition (the partition's digest is not the
 * shard's); each key's jobs share one partition and one shard, in insert order; a worker given
 * `workerQueues` runs the jobs of every partition, each key's in insert order.
 */
import { Job, PartitionedQueue } from "@awa/core"
import { TestDatabase } from "@awa/testing"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Layer, Schema } from "effect"
import { SqlClient } from "effect/sql"
import * as Awa from "../src/Awa.ts"
import { AwaClient } from "../src/AwaClient.ts"
import { handler } from "../src/Handler.ts"
import { eventually } from "./support.ts"

const Order = Job.define({
  kind: "partitioned-order",
  args: Schema.Struct({ tenant: Schema.String, seq: Schema.Number }),
  queue: "orders"
})

const AwaLive = Awa.layerPg().pipe(Layer.provideMerge(TestDatabase.layer({ maxConnections: 12 })))

describe("partitioned queues", () => {
  it.live(
    "4 partitions × 4 shards: keys reach all 16 lanes, each key in one, in order; one worker runs them all",
    () =>
      Effect.gen(function* () {
        const pq = yield* PartitionedQueue.make("orders", 4)
        const awa = yield* AwaClient
        for (const queue of pq.queues) yield* awa.setEnqueueShards(queue, 4)
        // 199: not a multiple of the 4 shards, so without the ordering key a tenant's inserts (199 apart) would
        // take different rotor shards
        const tenants = Array.from({ length: 199 }, (_, i) => `tenant-${i}`)
        // three jobs per tenant, each insert routed by its tenant
        for (let seq = 0; seq < 3; seq++)
          for (const tenant of tenants) yield* awa.insert(Order, { tenant, seq }, pq.routeByKey(tenant))

        const sql = yield* SqlClient.SqlClient
        const rows = yield* sql<{
          queue: string
          shard: number
          tenant: string
          seq: number
          lane_seq: string
        }>`
        SELECT r.queue, r.shard, r.args ->> 'tenant' AS tenant, (r.args ->> 'seq')::int AS seq, r.lane_seq::text
        FROM awa.ready r WHERE r.queue LIKE 'orders%' ORDER BY r.job_id`
        assert.strictEqual(rows.length, 597)
        const lanes = new Set(rows.map((r) => `${r.queue}/${r.shard}`))
        assert.strictEqual(lanes.size, 16, `keyed traffic reached ${[...lanes].sort().join(", ")}`)
        for (const tenant of tenants) {
          const own = rows.filter((r) => r.tenant === tenant)
          assert.strictEqual(
            new Set(own.map((r) => `${r.queue}/${r.shard}`)).size,
            1,
            `${tenant} split over lanes`
          )
          assert.strictEqual(own[0]!.queue, pq.routeByKey(tenant).queue)
          assert.deepStrictEqual(
            own.map((r) => r.seq),
            [0, 1, 2]
          )
          const positions = own.map((r) => BigInt(r.lane_seq))
          assert.isTrue(
            positions[0]! < positions[1]! && positions[1]! < positions[2]!,
            `${tenant} out of lane order`
          )
        }

        // one worker over every partition (the same config for each)
        const started: Array<{ tenant: string; seq: number }> = []
        yield* Effect.scoped(
          Effect.gen(function* () {
            yield* Layer.build(
              Awa.worker({
                queues: pq.workerQueues({ maxConcurrency: 3 }),
                handlers: [handler(Order, (args) => Effect.sync(() => void started.push(args)))]
              })
            )
            yield* eventually(
              Effect.sync(() => started.length === 597),
              60_000,
              "all 597 jobs started"
            )
          })
        )
        for (const tenant of tenants)
          assert.deepStrictEqual(
            started.filter((s) => s.tenant === tenant).map((s) => s.seq),
            [0, 1, 2],
            `${tenant} started out of order`
          )
      }).pipe(Effect.provide(AwaLive))
  )
})
