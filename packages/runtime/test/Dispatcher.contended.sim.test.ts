/**
 * A keyed claim that took some jobs but stopped at a key another claimer's lock held (migration
 * 0041: `blocked: "contended"`) retries after the contended back-off (2–20 ms), as a claim that
 * took nothing for that reason does. Nothing else would claim the rest soon: the other claimer's
 * commit sends no signal (it is a claim, not a closure), so the jobs behind the lock waited for the
 * poll interval. Simulation layer, virtual time; the contention is injected into the first claim
 * that finds work, since the simulation's claims never contend.
 */
import { Job } from "@awa/core"
import { KeyGrants } from "@awa/storage"
import { assert, describe, it } from "@effect/vitest"
import { Clock, Effect, Exit, Layer, Schema, Scope } from "effect"
import * as Awa from "../src/Awa.ts"
import * as AwaClient from "../src/AwaClient.ts"
import { handler } from "../src/Handler.ts"
import { advance, keyedSimulation } from "./support.ts"

const Task = Job.define({
  kind: "contended_task",
  args: Schema.Struct({ n: Schema.Number }),
  queue: "cq",
  concurrencyKey: ({ n }) => `k${n}`
})

/**
 * The simulation, where the first keyed claim that finds work takes one job and reports that it
 * stopped at a key whose lock another claimer held; signals are sent by the test only.
 */
const harness = Effect.gen(function* () {
  let contendedOnce = false
  return yield* keyedSimulation((g) => ({
    ...g,
    claim: (params) =>
      Effect.suspend(() => {
        if (contendedOnce) return g.claim(params)
        return Effect.map(g.claim({ ...params, max: 1 }), (c) => {
          if (c._tag !== "Claimed") return c
          contendedOnce = true
          return { ...c, blocked: "contended" as const }
        })
      })
  }))
})

describe("a keyed claim stopped at a contended key", () => {
  it.effect("claims the rest after the contended back-off, not the poll interval", () =>
    Effect.gen(function* () {
      const h = yield* harness
      yield* Effect.gen(function* () {
        const grants = yield* KeyGrants
        yield* grants.create({ id: "p", maxInFlight: 10 })
        const started: Array<{ n: number; at: number }> = []
        const scope = yield* Scope.make()
        yield* Layer.buildWithScope(
          Awa.worker({
            // polls far apart: within the test only a wake-up or the contended retry claims
            queues: {
              cq: { keyPolicy: "p", maxConcurrency: 5, pollInterval: "60 seconds", idlePollMax: "10 minutes" }
            },
            handlers: [
              handler(Task, ({ n }) =>
                Effect.flatMap(Clock.currentTimeMillis, (at) =>
                  Effect.sync(() => void started.push({ n, at }))
                )
              )
            ],
            maintenance: false
          }),
          scope
        )
        yield* advance(1_000, 10)
        const client = yield* AwaClient.AwaClient
        yield* client.insertMany(Task, [{ n: 1 }, { n: 2 }, { n: 3 }])
        const t0 = yield* Clock.currentTimeMillis
        yield* h.send({ _tag: "Wake", queue: "cq" })
        yield* advance(200, 2)
        assert.deepStrictEqual(
          started.map((s) => s.n),
          [1, 2, 3],
          "the jobs behind the contended key start before the 60-second poll"
        )
        assert.isAtMost(started[1]!.at - t0, 40, "within the 2–20 ms back-off (and the claim's own step)")
        yield* Scope.close(scope, Exit.void)
      }).pipe(Effect.provide(h.layer))
    })
  )
})
