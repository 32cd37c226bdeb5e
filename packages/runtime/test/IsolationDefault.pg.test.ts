/**
 * A worker and its leader on a database whose sessions default to REPEATABLE READ or SERIALIZABLE
 * (`ALTER DATABASE … SET default_transaction_isolation`), as some applications configure theirs
 * (issue 13 item 3, review C1, migration 0027). The storage functions refuse other levels; the
 * storage layer runs its calls at READ COMMITTED anyway (ReadCommitted.ts), so claims,
 * completions, heartbeats, promotion, rotation and prune all work, and a job inserted in the
 * application's own transaction (at the database's level) is claimed after promotion.
 */
import { Job } from "@awa/core"
import { QueueStorage } from "@awa/storage"
import { TestDatabase } from "@awa/testing"
import { PgClient } from "@effect/sql-pg"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Layer, Redacted, Schema } from "effect"
import { SqlClient } from "effect/sql"
import { inject } from "vitest"
import * as Awa from "../src/Awa.ts"
import { AwaClient } from "../src/AwaClient.ts"
import { handler } from "../src/Handler.ts"
import { eventually } from "./support.ts"

const Tick = Job.define({ kind: "rr_tick", args: Schema.Struct({ n: Schema.Number }), queue: "rr" })

type Level = "repeatable read" | "serializable"

/** A fresh migrated database whose sessions default to `level`, with Awa on it. */
const databaseAt = (level: Level) =>
  Layer.unwrap(
    Effect.gen(function* () {
      const { name, url } = yield* TestDatabase.acquire()
      yield* TestDatabase.withAdmin(
        inject("awaAdminUrl"),
        (sql) =>
          sql.unsafe(`ALTER DATABASE "${name}" SET default_transaction_isolation = '${level}'`).unprepared
      )
      return Awa.layerPg().pipe(
        Layer.provideMerge(PgClient.layer({ url: Redacted.make(url), maxConnections: 12 }))
      )
    })
  )

for (const level of ["repeatable read", "serializable"] as const)
  describe(`a database whose default isolation is ${level.toUpperCase()}`, () => {
    it.live("the worker and the leader run every job, rotate and prune", () =>
      Effect.gen(function* () {
        const sql = yield* SqlClient.SqlClient
        const client = yield* AwaClient
        const storage = yield* QueueStorage
        const [current] = yield* sql<{
          level: string
        }>`SELECT current_setting('transaction_isolation') AS level`
        assert.strictEqual(current!.level, level)
        const ran = new Set<number>()
        const handlers = [handler(Tick, ({ n }) => Effect.sync(() => void ran.add(n)))]
        const start = yield* storage.status
        yield* Effect.gen(function* () {
          for (let round = 0; round < 6; round++) {
            // half inside the application's own transaction (at the database's level), half on their own
            yield* sql.withTransaction(client.insertMany(Tick, [{ n: 2 * round }]))
            yield* client.insertMany(Tick, [{ n: 2 * round + 1 }])
            yield* eventually(
              Effect.sync(() => ran.size === 2 * round + 2),
              30_000,
              `round ${round} ran`
            )
          }
          // The leader kept the ring moving: it rotated (the first round's rows made the slot of
          // `start` due), and pruned every slot it sealed, those holding the jobs that ran
          // included. Not "n rotations": a slot rotates only once it holds rows, so how many the
          // rounds cause depends on how they fall between rotation ticks (the last may leave an
          // empty slot current, which then never rotates; CI once waited 30 s for a third).
          let last: unknown
          yield* eventually(
            Effect.map(storage.status, (s) => {
              last = s
              return s.generation > start.generation && s.oldestUnpruned === null
            }),
            30_000,
            "the ring rotated and pruned"
          ).pipe(
            Effect.onError(() => Effect.sync(() => console.error("ring status at the timeout", start, last)))
          )
        }).pipe(
          Effect.provide(
            Awa.worker({
              queues: { rr: { maxConcurrency: 4 } },
              handlers,
              maintenance: {
                electionInterval: "50 millis",
                promoteInterval: "20 millis",
                rotateInterval: "50 millis",
                rotateMinRows: 1,
                pruneCarryAfter: 0
              }
            })
          ),
          Effect.scoped
        )
        const counts = yield* storage.countByQueueState
        assert.deepStrictEqual(
          counts.filter((c) => c.queue === "rr").map((c) => [c.state, c.count]),
          [["completed", 12]]
        )
      }).pipe(Effect.provide(databaseAt(level)))
    )
  })
