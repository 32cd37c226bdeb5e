/**
 * The leader's answer to a prune that keeps failing on its lock (ADR 0018): after 3 ticks blocked
 * on the lock it queues for it (`forceLockTimeoutMs`, 200 ms, doubling per failed forced attempt up
 * to 2 s), and after a failed forced attempt it waits 2^k ticks before the next one; NOWAIT
 * attempts go on every tick in between.
 */
import { Job } from "@awa/core"
import type { PruneOutcome } from "@awa/storage"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Schema } from "effect"
import { TestClock } from "effect/testing"
import { handler } from "../src/Handler.ts"
import * as Leader from "../src/Leader.ts"
import { resolveConfig } from "../src/Worker.ts"
import { leaderStorage } from "./support.ts"

const Tick = Job.define({ kind: "tick", args: Schema.Struct({ n: Schema.Number }), queue: "live" })
const handlers = [handler(Tick, () => Effect.void)]

/**
 * Storage whose prune is blocked on its lock unless forced; forced attempts answer `forced` in
 * turn. Records the force timeout of every prune call (undefined = NOWAIT).
 */
const blockedStorage = (forced: ReadonlyArray<"Pruned" | "Blocked">) => {
  const calls: Array<number | undefined> = []
  let next = 0
  const layer = leaderStorage(() => ({
    rotateWhenDue: () => Effect.succeed("Rotated" as const),
    prune: (p) =>
      Effect.sync((): PruneOutcome => {
        calls.push(p.forceLockTimeoutMs)
        const answer = p.forceLockTimeoutMs === undefined ? "Blocked" : (forced[next++] ?? "Blocked")
        return answer === "Pruned"
          ? { _tag: "Pruned", generation: 1n, carried: 0 }
          : { _tag: "Blocked", reason: "lock" }
      }),
    trimLedgers: () => Effect.succeed({ deleted: 0, more: false })
  }))
  return { calls, layer }
}

/** Runs the duties for `seconds` of test time at one rotate-prune tick per second. */
const run = (seconds: number, forced: ReadonlyArray<"Pruned" | "Blocked">) =>
  Effect.gen(function* () {
    const config = yield* resolveConfig({
      queues: { live: {} },
      handlers,
      maintenance: { rotateInterval: "1 second" }
    })
    const { calls, layer } = blockedStorage(forced)
    yield* Effect.scoped(
      Effect.andThen(Leader.duties(config.maintenance!), TestClock.adjust(`${seconds} seconds`))
    ).pipe(Effect.provide(layer))
    return calls
  })

describe("Leader: prune cannot starve", () => {
  it.effect("queues for the lock after 3 blocked ticks, and again after 2 ticks when that fails too", () =>
    Effect.gen(function* () {
      // ticks 1–3 NOWAIT; tick 4 forced (200 ms) fails; tick 5 NOWAIT; tick 6 forced (400 ms) prunes,
      // and the tick goes on with NOWAIT prunes (the counters start again)
      const calls = yield* run(5, ["Blocked", "Pruned"])
      assert.deepStrictEqual(calls.slice(0, 7), [
        undefined,
        undefined,
        undefined,
        200,
        undefined,
        400,
        undefined
      ])
    })
  )

  it.effect("backs off 2, 4, 8 … ticks between failed forced attempts, the timeout doubling up to 2 s", () =>
    Effect.gen(function* () {
      const calls = yield* run(40, [])
      const forcedAt = calls.flatMap((t, i) => (t === undefined ? [] : [[i + 1, t]]))
      assert.deepStrictEqual(forcedAt, [
        [4, 200],
        [6, 400],
        [10, 800],
        [18, 1600],
        [34, 2000]
      ])
    })
  )
})
