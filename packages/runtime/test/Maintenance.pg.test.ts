/**
 * The queue ring's maintenance policy set where the rest of maintenance is set (the worker's
 * `maintenance` options), and the leader keeping the ring ledgers bounded (migration 0017).
 */
import { AwaConfigError, Job } from "@awa/core"
import { QueueStorage } from "@awa/storage"
import { TestDatabase } from "@awa/testing"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Layer, Schema } from "effect"
import { SqlClient } from "effect/sql"
import * as Awa from "../src/Awa.ts"
import { AwaClient } from "../src/AwaClient.ts"
import { handler } from "../src/Handler.ts"
import { resolveConfig } from "../src/Worker.ts"
import { eventually } from "./support.ts"

const Tick = Job.define({ kind: "tick", args: Schema.Struct({ n: Schema.Number }), queue: "ledger" })
const handlers = [handler(Tick, () => Effect.void)]
const fast = {
  electionInterval: "50 millis",
  promoteInterval: "50 millis",
  rescueInterval: "1 second",
  rotateInterval: "20 millis"
} as const

// The storage layer's policy: 10,000 rows (the default) or an hour, so its age rule cannot rotate
// during the test however slowly a loaded machine runs it.
const AwaLive = () =>
  Awa.layerPg({ rotateMaxAgeMs: 3_600_000 }).pipe(
    Layer.provideMerge(TestDatabase.layer({ maxConnections: 8 }))
  )

const generation = Effect.map(
  Effect.flatMap(QueueStorage, (s) => s.status),
  (s) => Number(s.generation)
)

describe("maintenance options", () => {
  it.effect(
    "the ring policy is checked with the other maintenance options; unset keeps the storage layer's",
    () =>
      Effect.gen(function* () {
        const error = yield* Effect.flip(
          resolveConfig({
            queues: { ledger: {} },
            handlers,
            maintenance: { rotateMinRows: 0, rotateMaxAge: "2 hours", pruneCarryAfter: "1.5 millis" }
          })
        )
        assert.instanceOf(error, AwaConfigError)
        assert.deepStrictEqual(error.issues.map((i) => i.path).sort(), [
          "maintenance.pruneCarryAfter",
          "maintenance.rotateMaxAge",
          "maintenance.rotateMinRows"
        ])
        const bad = yield* Effect.flip(
          resolveConfig({ queues: { ledger: {} }, handlers, maintenance: { rotateMinRows: 2.5 } })
        )
        assert.deepStrictEqual(
          bad.issues.map((i) => i.path),
          ["maintenance.rotateMinRows"]
        )
        const set = yield* resolveConfig({
          queues: { ledger: {} },
          handlers,
          maintenance: { rotateMinRows: 50, rotateMaxAge: "0 millis", pruneCarryAfter: "2 seconds" }
        })
        assert.deepStrictEqual(set.maintenance?.rotate, { minRows: 50, maxAgeMs: 0 })
        assert.strictEqual(set.maintenance?.pruneCarryAfterMs, 2000)
        const unset = yield* resolveConfig({ queues: { ledger: {} }, handlers })
        assert.deepStrictEqual(unset.maintenance?.rotate, { minRows: undefined, maxAgeMs: undefined })
        assert.strictEqual(unset.maintenance?.pruneCarryAfterMs, undefined)
      })
  )

  it.live(
    "the leader rotates by the worker's rotateMinRows, and keeps the ring ledgers under two wraps",
    () =>
      Effect.gen(function* () {
        const client = yield* AwaClient
        const sql = yield* SqlClient.SqlClient
        // a fresh incarnation first
        yield* client.insert(Tick, { n: 0 })
        yield* Effect.flatMap(QueueStorage, (s) => s.rotateWhenDue({ minRows: 1 }))
        const start = yield* generation
        // the storage layer's policy (10,000 rows or an hour): 20 jobs and a second change nothing
        yield* Effect.scoped(
          Effect.gen(function* () {
            yield* client.insertMany(
              Tick,
              Array.from({ length: 20 }, (_, n) => ({ n }))
            )
            yield* Effect.sleep("1 second")
          }).pipe(Effect.provide(Awa.worker({ queues: { ledger: {} }, handlers, maintenance: fast })))
        )
        assert.strictEqual(yield* generation, start)
        // the worker's: a rotation every 5 rows, carrying at once; 60 bursts of 5, each waiting
        // for its rotation (not for time, which a loaded machine stretches), turn the ring many
        // times over, and the leader trims its ledgers as it goes
        yield* Effect.scoped(
          Effect.gen(function* () {
            yield* eventually(Effect.map(generation, (g) => g > start))
            for (let i = 0; i < 60; i++) {
              const before = yield* generation
              yield* client.insertMany(
                Tick,
                Array.from({ length: 5 }, (_, n) => ({ n }))
              )
              yield* eventually(
                Effect.map(generation, (g) => g > before),
                20_000,
                `the rotation after burst ${i}`
              )
            }
          }).pipe(
            Effect.provide(
              Awa.worker({
                queues: { ledger: {} },
                handlers,
                maintenance: { ...fast, rotateMinRows: 5, pruneCarryAfter: 0 }
              })
            )
          )
        )
        const [rows] = yield* sql<{ rotations: number; prunes: number }>`
          SELECT (SELECT count(*)::int FROM awa.ring_rotations WHERE ring = 'queue') AS rotations,
                 (SELECT count(*)::int FROM awa.ring_prunes WHERE ring = 'queue') AS prunes`
        assert.isAtMost(rows!.rotations, 2 * 16 + 1)
        assert.isAtMost(rows!.prunes, 2 * 16 + 1)
        // nothing lost: every prune is still counted
        const [totals] = yield* sql<{ prunes: number; g: number }>`
          SELECT (awa.ledger_totals('queue')).prunes::int AS prunes, c.generation::int AS g
          FROM awa.ring_current('queue') c`
        assert.isAtLeast(totals!.prunes, totals!.g - 16)
        assert.isAtMost(totals!.prunes, totals!.g)
      }).pipe(Effect.provide(AwaLive())),
    60_000
  )
})
