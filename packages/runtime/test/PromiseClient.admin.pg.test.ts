/**
 * The Promise facade's operator reads (issue 18): queue statistics, storage status and doctor,
 * and a bulk action, through the same `Admin` service the CLI uses.
 */
import { TestDatabase } from "@awa/testing"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Schema } from "effect"
import { createClient } from "../src/PromiseClient.ts"

describe("Promise facade: operator reads", () => {
  it.live("queueStats, status, doctor and drainQueue", () =>
    Effect.flatMap(TestDatabase.acquire(), ({ url }) =>
      Effect.promise(async () => {
        const awa = await createClient({ databaseUrl: url })
        try {
          const Ping = awa.define({
            kind: "ping",
            args: Schema.Struct({ n: Schema.Number }),
            queue: "facade-stats"
          })
          await awa.insertMany(Ping, [{ n: 1 }, { n: 2 }, { n: 3 }])
          await awa.insert(Ping, { n: 4 }, { runAt: new Date(Date.now() + 3_600_000) })
          await awa.pauseQueue("facade-stats")
          const report = await awa.queueStats()
          const mine = report.queues.find((q) => q.queue === "facade-stats")
          assert.deepStrictEqual(
            [mine?.paused, mine?.available, mine?.scheduled, mine?.running, report.exact],
            [true, 3, 1, 0, false]
          )
          assert.isNotNull(mine?.oldestAvailableAt)
          const exact = await awa.queueStats({ exact: true })
          assert.deepStrictEqual(exact.queues.find((q) => q.queue === "facade-stats")?.stored, {
            completed: 0,
            failed: 0,
            cancelled: 0
          })
          const status = await awa.status()
          assert.strictEqual(status.schemaVersion, status.latestVersion)
          assert.deepStrictEqual(
            status.rings.map((r) => r.ring),
            ["queue", "history"]
          )
          const checks = await awa.doctor()
          assert.strictEqual(checks.find((c) => c.name === "schema")?.status, "pass")
          assert.strictEqual(await awa.drainQueue("facade-stats"), 4)
          const drained = (await awa.queueStats()).queues.find((q) => q.queue === "facade-stats")
          assert.deepStrictEqual(
            [drained?.available, drained?.scheduled, drained?.finalizedTotal.cancelled],
            [0, 0, 4]
          )
        } finally {
          await awa.close()
        }
      })
    )
  )
})
