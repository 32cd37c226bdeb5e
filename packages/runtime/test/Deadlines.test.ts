/**
 * The deadline watchdog under virtual time: each registered deadline fires once, at its expiry
 * and not before, in expiry order across durations; removed ones never fire.
 */
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { TestClock } from "effect/testing"
import * as Deadlines from "../src/Deadlines.ts"

const settle = Effect.gen(function* () {
  for (let i = 0; i < 5; i++) yield* Effect.yieldNow
})

describe("Deadlines", () => {
  it.effect("fires each deadline once at its expiry, in expiry order across durations", () =>
    Effect.gen(function* () {
      const deadlines = yield* Deadlines.make()
      yield* Effect.forkChild(deadlines.run)
      const fired: Array<string> = []
      const at = (name: string) => () => Effect.sync(() => void fired.push(name))
      deadlines.add(0, 300, at("a:300"))
      deadlines.add(0, 100, at("b:100"))
      deadlines.add(50, 300, at("c:350"))
      deadlines.add(60, 100, at("d:160"))
      yield* settle
      yield* TestClock.adjust(99)
      yield* settle
      assert.deepStrictEqual(fired, [], "nothing before the first expiry")
      yield* TestClock.adjust(1)
      yield* settle
      assert.deepStrictEqual(fired, ["b:100"])
      yield* TestClock.adjust(200)
      yield* settle
      assert.deepStrictEqual(fired, ["b:100", "d:160", "a:300"])
      yield* TestClock.adjust(49)
      yield* settle
      assert.deepStrictEqual(fired, ["b:100", "d:160", "a:300"])
      yield* TestClock.adjust(1)
      yield* settle
      assert.deepStrictEqual(fired, ["b:100", "d:160", "a:300", "c:350"])
      yield* TestClock.adjust(10_000)
      yield* settle
      assert.strictEqual(fired.length, 4, "each fires once")
    })
  )

  it.effect("a removed deadline never fires; the ones around it still do", () =>
    Effect.gen(function* () {
      const deadlines = yield* Deadlines.make()
      yield* Effect.forkChild(deadlines.run)
      const fired: Array<number> = []
      const nodes = [0, 1, 2, 3].map((i) =>
        deadlines.add(i * 10, 100, () => Effect.sync(() => void fired.push(i)))
      )
      deadlines.remove(nodes[0]!) // the head
      deadlines.remove(nodes[2]!) // the middle
      deadlines.remove(nodes[2]!) // twice is a no-op
      yield* settle
      yield* TestClock.adjust(1_000)
      yield* settle
      assert.deepStrictEqual(fired, [1, 3])
      // a deadline added after its list emptied wakes the loop again
      deadlines.add(1_000, 100, () => Effect.sync(() => void fired.push(4)))
      yield* settle
      yield* TestClock.adjust(100)
      yield* settle
      assert.deepStrictEqual(fired, [1, 3, 4])
    })
  )
})
