/**
 * A term that ends (worker shutdown, lost leadership) while a duty's statement is in flight lets
 * that statement finish, and stops the duty before its next one. Interrupted, the statement would
 * be cancelled on the server and its writes rolled back: a prune's history copy of a whole slot
 * left as dead tuples in a ring child (seen in the harness's drain phase on Debian's PostgreSQL
 * 15 as 0.16 dead history tuples per drained job), to be copied again by the next leader.
 */
import { Job } from "@awa/core"
import type { PruneOutcome } from "@awa/storage"
import { assert, describe, it } from "@effect/vitest"
import { Deferred, Effect, Exit, Fiber, Schema, Scope } from "effect"
import { handler } from "../src/Handler.ts"
import * as Leader from "../src/Leader.ts"
import { resolveConfig } from "../src/Worker.ts"
import { leaderStorage } from "./support.ts"

const Tick = Job.define({ kind: "tick", args: Schema.Struct({ n: Schema.Number }), queue: "live" })
const handlers = [handler(Tick, () => Effect.void)]

/**
 * Storage whose prunes each find a slot to prune (so a tick goes on to the next one) and whose
 * first prune waits for `gate`, as a statement in flight on the server would. `events` records
 * each prune's start, its end and an interruption of it.
 */
const gatedStorage = (started: Deferred.Deferred<void>, gate: Deferred.Deferred<void>) => {
  const events: Array<string> = []
  let calls = 0
  const layer = leaderStorage(() => ({
    rotateWhenDue: () => Effect.succeed("Rotated" as const),
    prune: () =>
      Effect.suspend(() => {
        const n = ++calls
        events.push(`prune ${n} started`)
        const statement =
          n === 1 ? Effect.andThen(Deferred.succeed(started, undefined), Deferred.await(gate)) : Effect.void
        return statement.pipe(
          Effect.as<PruneOutcome>({ _tag: "Pruned", generation: BigInt(n), carried: 0 }),
          Effect.tap(() => Effect.sync(() => events.push(`prune ${n} finished`))),
          Effect.onInterrupt(() => Effect.sync(() => events.push(`prune ${n} interrupted`)))
        )
      }),
    trimLedgers: () => Effect.succeed({ deleted: 0, more: false })
  }))
  return { events, layer }
}

describe("Leader: a term's end and the statement in flight", () => {
  it.effect("lets the prune in flight finish and starts no further prune", () =>
    Effect.gen(function* () {
      const config = yield* resolveConfig({ queues: { live: {} }, handlers })
      const started = yield* Deferred.make<void>()
      const gate = yield* Deferred.make<void>()
      const { events, layer } = gatedStorage(started, gate)
      const term = yield* Scope.make()
      // the rotate-prune duty's first tick runs at once: its first prune waits on the gate
      yield* Leader.duties(config.maintenance!).pipe(Scope.provide(term), Effect.provide(layer))
      yield* Deferred.await(started)
      // the term ends while the prune is in flight; the statement then completes
      const ending = yield* Effect.forkChild(Scope.close(term, Exit.void), { startImmediately: true })
      yield* Deferred.succeed(gate, undefined)
      yield* Fiber.join(ending)
      assert.deepStrictEqual(events, ["prune 1 started", "prune 1 finished"])
    })
  )
})
