/**
 * The CLI's additions of issue 18's second pass, against Postgres: `status` shows each ring's
 * recorded prune state (and `--json` has it), `queues` shows the sampled rates, and `serve`
 * answers `/readyz` from its own LISTEN and with 503 during its shutdown grace.
 */
import { QueueStorage } from "@awa/storage"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Fiber } from "effect"
import { awa, fresh, httpGet, json, until, withDatabase } from "./support.ts"

const sampleNow = { minIntervalMs: 0, keepMs: 7_200_000 }

describe("awa CLI: operator additions", () => {
  it.live("status shows the leader's recorded prune state per ring; --json carries it", () =>
    withDatabase((url) =>
      Effect.gen(function* () {
        const storage = yield* QueueStorage
        const before = yield* awa(url, "status")
        assert.match(before.out, /oldest unpruned +unpruned for +last prune +prune state +size\n/)
        assert.match(before.out, /\nqueue {4}0 +0 +- +- +never +- /)
        yield* storage.recordPruneState("queue", { outcome: "blocked", reason: "lock" })
        yield* storage.recordPruneState("history", { outcome: "ok", reason: null })
        const after = yield* awa(url, "status")
        assert.strictEqual(after.code, 0)
        assert.match(after.out, /\nqueue {4}0 +0 +- +- +never +blocked \(lock\) for \d+(ms|s) /)
        assert.match(after.out, /\nhistory {2}0 +0 +- +- +never +ok for \d+(ms|s) /)
        const report = json(yield* awa(url, "--json", "status"))
        assert.deepStrictEqual(
          report.rings.map((r: { prune: { outcome: string; reason: string | null } }) => [
            r.prune.outcome,
            r.prune.reason
          ]),
          [
            ["blocked", "lock"],
            ["ok", null]
          ]
        )
      })
    )
  )

  it.live("queues shows per-minute rates from the leader's samples, '-' before there are two", () =>
    withDatabase((url) =>
      Effect.gen(function* () {
        const storage = yield* QueueStorage
        const q = fresh("cli-rates")
        const row = (out: string) => out.split("\n").find((l) => l.startsWith(q))!
        // the first sample is the baseline: jobs enqueued after it are counted
        yield* storage.sampleQueueStats(sampleNow)
        yield* storage.enqueueMany([1, 2, 3, 4].map((n) => ({ kind: "k", queue: q, args: { n } })))
        assert.match(row((yield* awa(url, "queues")).out), / +- +- +-$/)
        for (let i = 0; i < 2; i++) yield* storage.sampleQueueStats(sampleNow)
        const ran = yield* awa(url, "queues", "--window", "3600")
        assert.strictEqual(ran.code, 0)
        // enq/min, done/min, fail/min: four enqueued over the samples' span, nothing finished
        assert.match(row(ran.out), / +\d+(\.\d)? +0 +0$/)
        assert.notMatch(row(ran.out), / +0 +0 +0$/)
        assert.include(ran.out, "rates: from the leader's samples")
        const report = json(yield* awa(url, "--json", "queues", "--window", "3600"))
        const mine = report.queues.find((x: { queue: string }) => x.queue === q)
        assert.strictEqual(mine.rates.enqueued, 4)
      })
    )
  )

  it.live("serve: /readyz answers 503 'shutting down' during the grace, then the server goes", () =>
    withDatabase((url) =>
      Effect.gen(function* () {
        const port = 40_000 + Math.floor(Math.random() * 20_000)
        const fiber = yield* Effect.forkChild(
          awa(url, "serve", "--port", String(port), "--shutdown-grace", "3")
        )
        const get = httpGet(`http://127.0.0.1:${port}`)
        // without a maintenance leader it is not ready, for that reason
        const before = yield* until(get, "/readyz", (r) => r.status !== 0)
        assert.strictEqual(before.status, 503)
        // SIGTERM's effect: the serve fiber interrupted; readiness goes first, the server after
        const stopping = yield* Effect.forkChild(Fiber.interrupt(fiber))
        const down = yield* until(get, "/readyz", (r) => r.status === 503 && r.body.includes("shutting down"))
        assert.strictEqual(JSON.parse(down.body).message, "shutting down")
        assert.strictEqual((yield* get("/healthz")).status, 200)
        yield* Fiber.join(stopping)
        assert.strictEqual((yield* get("/healthz")).status, 0)
      })
    )
  )
})
