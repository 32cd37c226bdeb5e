/**
 * Testing your handlers without Postgres: the simulation layer and virtual time. Used by
 * docs/guide.md and run by test/docs-examples.test.ts (inside `it.effect`, which provides
 * `TestClock`).
 */
import { Awa, AwaClient, Handler, Job } from "@awa/effect"
import { Effect, Layer, Schema } from "effect"
import { TestClock } from "effect/testing"

const Ping = Job.define({
  kind: "ping",
  args: Schema.Struct({ host: Schema.String }),
  queue: "checks",
  backoff: (attempt) => `${attempt * 10} seconds`
})

let calls = 0
const ping = Handler.handler(Ping, () =>
  Effect.suspend(() =>
    ++calls < 3 ? Effect.fail(new Job.JobRetryableError({ message: "timeout" })) : Effect.void
  )
)

/** Fails twice, then succeeds: after 10 s and 20 s of virtual backoff the job is completed. */
export const retriesUnderVirtualTime = Effect.gen(function* () {
  const awa = yield* AwaClient.AwaClient
  const job = yield* awa.insert(Ping, { host: "example.com" })
  for (let t = 0; t < 40_000; t += 100) {
    yield* TestClock.adjust("100 millis")
    yield* Effect.yieldNow
  }
  return yield* awa.storage.getJob(job.id)
}).pipe(
  Effect.provide(
    Awa.worker({ queues: { checks: { pollInterval: "100 millis" } }, handlers: [ping] }).pipe(
      Layer.provideMerge(Awa.layerSim())
    )
  )
)
