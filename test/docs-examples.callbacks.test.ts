/** docs/callbacks.md's example runs here, so the chapter cannot drift from the code. */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { paymentFlow } from "../docs/examples/callbacks.ts"

describe("docs examples: callbacks", () => {
  it.effect("a payment webhook: filtered, paid, declined", () =>
    Effect.map(paymentFlow, (r) =>
      assert.deepStrictEqual(r, { ignored: "Ignored", paid: "completed", declined: "failed" })
    )
  )
})
