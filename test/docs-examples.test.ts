/** Every example in docs/ runs here, so the guide cannot drift from the code. */
import { TestDatabase } from "@awa/testing"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { main } from "../docs/examples/promise.ts"
import { program, sent } from "../docs/examples/quickstart.ts"
import { retriesUnderVirtualTime } from "../docs/examples/simulation.ts"

describe("docs examples", () => {
  it.live("quickstart: enqueue in a transaction and process with a worker", () =>
    Effect.gen(function* () {
      const ids = yield* program
      assert.strictEqual(ids.length, 2)
      assert.deepStrictEqual([...sent].sort(), ["ada@example.com", "grace@example.com"])
    }).pipe(Effect.provide(TestDatabase.layer({ migrated: false })))
  )

  it.live("promise facade: define, start, insert, stop", () =>
    Effect.flatMap(TestDatabase.acquire({ migrated: false }), ({ url }) =>
      Effect.promise(() => main(url)).pipe(
        Effect.map((done) => assert.deepStrictEqual(done, ["cat.png@640"]))
      )
    )
  )

  it.effect("simulation: retries under virtual time", () =>
    Effect.map(retriesUnderVirtualTime, (job) => {
      assert.strictEqual(job.state, "completed")
      assert.strictEqual(job.attempt, 3)
      assert.deepStrictEqual(
        job.errors.map((e) => e.error),
        ["timeout", "timeout"]
      )
    })
  )
})
