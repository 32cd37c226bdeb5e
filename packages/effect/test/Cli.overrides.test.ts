/**
 * `awa queue overrides set|clear|show` against Postgres (issue 20, capabilities.md §13).
 */
import { TestDatabase } from "@awa/testing"
import { NodeServices } from "@effect/platform-node"
import { assert, describe, it } from "@effect/vitest"
import { Console, Effect } from "effect"
import * as Cli from "../src/Cli.ts"

/** Runs `awa <args>` with `--database-url url`, capturing what it prints. */
const awa = (url: string, ...args: ReadonlyArray<string>) =>
  Effect.gen(function* () {
    const out: Array<string> = []
    const err: Array<string> = []
    const capture: Console.Console = {
      ...globalThis.console,
      log: (...a: ReadonlyArray<unknown>) => void out.push(a.map(String).join(" ")),
      error: (...a: ReadonlyArray<unknown>) => void err.push(a.map(String).join(" "))
    }
    const code = yield* Cli.run(["--database-url", url, ...args]).pipe(
      Effect.provideService(Console.Console, capture),
      Effect.provide(NodeServices.layer)
    )
    return { code, out: out.join("\n"), err: err.join("\n") }
  })

describe("awa queue overrides", () => {
  it.live(
    "set replaces the set, show lists it (table and --json), clear removes it; bad values exit 1 and write nothing",
    () =>
      Effect.scoped(
        Effect.flatMap(TestDatabase.acquire(), ({ url }) =>
          Effect.gen(function* () {
            const set = yield* awa(
              url,
              "--json",
              "queue",
              "overrides",
              "set",
              "email",
              "--max-rate",
              "12.5",
              "--burst",
              "4",
              "--deadline-ms",
              "60000"
            )
            assert.strictEqual(set.code, 0, set.err)
            assert.deepStrictEqual(JSON.parse(set.out), {
              queue: "email",
              overrides: { rateLimit: { maxRate: 12.5, burst: 4 }, deadlineMs: 60000 }
            })
            const replaced = yield* awa(url, "queue", "overrides", "set", "email", "--claim-batch-size", "7")
            assert.strictEqual(replaced.code, 0, replaced.err)
            assert.include(replaced.out, "claimBatchSize=7")
            const shown = yield* awa(url, "--json", "queue", "overrides", "show")
            const rows = JSON.parse(shown.out) as Array<{
              queue: string
              overrides: unknown
              invalid: unknown
            }>
            assert.deepStrictEqual(
              rows.map((r) => [r.queue, r.overrides, r.invalid]),
              [["email", { claimBatchSize: 7 }, []]]
            )
            const table = yield* awa(url, "queue", "overrides", "show", "email")
            assert.match(table.out, /email\s+claimBatchSize=7/)
            const bad = yield* awa(url, "queue", "overrides", "set", "email", "--poll-interval-ms", "5")
            assert.strictEqual(bad.code, 1)
            assert.include(bad.err, "pollInterval")
            const still = yield* awa(url, "--json", "queue", "overrides", "show", "email")
            assert.deepStrictEqual((JSON.parse(still.out) as Array<{ overrides: unknown }>)[0]?.overrides, {
              claimBatchSize: 7
            })
            const cleared = yield* awa(url, "--json", "queue", "overrides", "clear", "email")
            assert.deepStrictEqual(JSON.parse(cleared.out), { queue: "email", cleared: true })
            const none = yield* awa(url, "queue", "overrides", "show")
            assert.strictEqual(none.out, "no queue overrides")
          })
        )
      )
  )

  it.live(
    "--fleet-max-rate and --fleet-burst set fleetRateLimit; out of range exits 1; --fleet-burst alone is a usage error",
    () =>
      Effect.scoped(
        Effect.flatMap(TestDatabase.acquire(), ({ url }) =>
          Effect.gen(function* () {
            const set = yield* awa(
              url,
              "--json",
              "queue",
              "overrides",
              "set",
              "partner",
              "--fleet-max-rate",
              "50",
              "--fleet-burst",
              "10"
            )
            assert.strictEqual(set.code, 0, set.err)
            assert.deepStrictEqual(JSON.parse(set.out), {
              queue: "partner",
              overrides: { fleetRateLimit: { maxRate: 50, burst: 10 } }
            })
            const table = yield* awa(url, "queue", "overrides", "show", "partner")
            assert.match(table.out, /partner\s+fleetRateLimit=50\/s burst 10/)
            const bad = yield* awa(url, "queue", "overrides", "set", "partner", "--fleet-max-rate", "0")
            assert.strictEqual(bad.code, 1)
            assert.include(bad.err, "fleetRateLimit")
            const usage = yield* awa(url, "queue", "overrides", "set", "partner", "--fleet-burst", "3")
            assert.strictEqual(usage.code, 1)
            assert.include(usage.err, "--fleet-burst needs --fleet-max-rate")
            const still = yield* awa(url, "--json", "queue", "overrides", "show", "partner")
            assert.deepStrictEqual((JSON.parse(still.out) as Array<{ overrides: unknown }>)[0]?.overrides, {
              fleetRateLimit: { maxRate: 50, burst: 10 }
            })
          })
        )
      )
  )
})
