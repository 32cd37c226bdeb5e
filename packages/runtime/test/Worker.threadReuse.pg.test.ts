/**
 * A worker restarted on the same `Awa.layerPg` (dynamic queue sets, tests, blue/green within one
 * process, the benchmark's timed drain after its warm-up) reuses the heartbeat thread the first
 * one started, instead of loading Effect again in a new isolate (issue 17). Observed through the
 * thread's connection: the same backend serves both workers.
 */
import { Job } from "@awa/core"
import { TestDatabase } from "@awa/testing"
import { PgClient } from "@effect/sql-pg"
import { assert, describe, it } from "@effect/vitest"
import { Context, Effect, Exit, Layer, Redacted, Schema, Scope } from "effect"
import { SqlClient } from "effect/sql"
import * as Awa from "../src/Awa.ts"
import { AwaClient } from "../src/AwaClient.ts"
import { handler } from "../src/Handler.ts"
import { eventually } from "./support.ts"

const Ping = Job.define({ kind: "ping", args: Schema.Struct({ n: Schema.Number }), queue: "reuse" })

describe("a worker restarted on the same layer", () => {
  it.live("reuses the heartbeat thread of the previous worker", () =>
    Effect.gen(function* () {
      const { url } = yield* TestDatabase.acquire()
      const pg = PgClient.layer({ url: Redacted.make(url), maxConnections: 4 })
      const runtime = yield* Layer.build(Awa.layerPg().pipe(Layer.provideMerge(pg)))
      const observer = yield* Layer.build(PgClient.layer({ url: Redacted.make(url), maxConnections: 1 }))
      const sql = Context.get(observer, SqlClient.SqlClient)
      const client = Context.get(runtime, AwaClient)
      const threadPids = Effect.map(
        sql<{ pid: number }>`
          SELECT pid FROM pg_stat_activity
          WHERE datname = current_database() AND application_name = 'awa heartbeat'`,
        (rows) => rows.map((r) => r.pid)
      )
      const done: Array<number> = []
      /** One worker's life: built, runs job `n`, closed. Returns the heartbeat backends it saw. */
      const workerRuns = (n: number) =>
        Effect.gen(function* () {
          const scope = yield* Scope.make()
          yield* Layer.buildWithScope(
            Awa.worker({
              queues: { reuse: { pollInterval: "50 millis" } },
              handlers: [handler(Ping, ({ n }) => Effect.sync(() => void done.push(n)))],
              maintenance: false
            }),
            scope
          ).pipe(Effect.provide(runtime))
          const pids = yield* threadPids
          yield* client.insert(Ping, { n })
          yield* eventually(
            Effect.sync(() => done.includes(n)),
            60_000,
            `job ${n} ran`
          )
          yield* Scope.close(scope, Exit.void)
          return pids
        })
      assert.deepStrictEqual(yield* threadPids, [], "the layer alone spawns no thread")
      const first = yield* workerRuns(1)
      assert.strictEqual(first.length, 1, "the first worker's thread is connected once it is built")
      const second = yield* workerRuns(2)
      assert.deepStrictEqual(second, first, "the second worker has the first one's thread")
    }).pipe(Effect.scoped)
  )
})
