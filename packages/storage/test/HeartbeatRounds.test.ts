/**
 * When heartbeat rounds run (`HeartbeatCore.roundSchedule`, `retryRound`), shared by the heartbeat
 * thread, its event-loop bridge and `Heartbeats.makeLoop`. Under the test clock: a storage whose
 * heartbeat takes a given time, or fails once as a terminated connection does.
 *
 * Also: an attempt a round found closed is reported once and not heartbeated again while held,
 * and one let go is not heartbeated again (the attempt table, ADR 0040).
 *
 * Fault scenario 2 (every connection terminated, staleness 1.5 s, interval 300 ms) rescued live
 * attempts when a slow round pushed the next one back by its own length, and when a failed
 * round waited a whole interval for the next (ADR 0019).
 */
import { assert, describe, it } from "@effect/vitest"
import { Clock, Effect, Exit, Scope, Stream } from "effect"
import { SqlError, UnknownError } from "effect/sql/SqlError"
import { TestClock } from "effect/testing"
import * as Heartbeats from "../src/Heartbeats.ts"
import { type HeartbeatItem, QueueStorage } from "../src/QueueStorage.ts"

const intervalMs = 300

/** A storage that only heartbeats: each call takes `callMs` (test clock); the first `failures` calls fail. */
const fakeStorage = (callMs: number, failures: number) => {
  const calls: Array<number> = []
  let failed = 0
  const heartbeatMany = (_items: ReadonlyArray<HeartbeatItem>) =>
    Effect.gen(function* () {
      calls.push(yield* Clock.currentTimeMillis)
      yield* Effect.sleep(callMs)
      if (failed < failures) {
        failed++
        return yield* new SqlError({
          reason: new UnknownError({
            cause: new Error("terminated"),
            message: "PgConnection: Connection closed"
          })
        })
      }
      return []
    })
  return { calls, storage: { heartbeatMany } as unknown as QueueStorage["Service"] }
}

/** Runs a loop session holding one attempt claimed at 0 for `forMs` of test time. */
const runFor = (storage: QueueStorage["Service"], forMs: number) =>
  Effect.gen(function* () {
    const scope = yield* Scope.make()
    const session = yield* Heartbeats.makeLoop({ intervalMs, maxStallMs: 600_000 }).pipe(
      Effect.provideService(QueueStorage, storage),
      Scope.provide(scope)
    )
    session.track(1n, 1n, 0)
    for (let t = 0; t < forMs; t += 10) yield* TestClock.adjust(10)
    yield* Scope.close(scope, Exit.void)
  })

describe("heartbeat rounds", () => {
  it.effect("a slow round does not push the next one back: rounds start every interval", () =>
    Effect.gen(function* () {
      // each heartbeat takes 250 ms of a 300 ms interval
      const { calls, storage } = fakeStorage(250, 0)
      yield* runFor(storage, 2000)
      // the attempt is due from 150 ms: rounds at 300, 600, …; with `spaced` they were 550 ms apart
      const gaps = calls.slice(1).map((t, i) => t - calls[i]!)
      assert.isAtLeast(calls.length, 5, `calls at ${calls}`)
      assert.deepStrictEqual([...new Set(gaps)], [intervalMs], `calls at ${calls}`)
    })
  )

  it.effect("a failed heartbeat is tried again at once, not an interval later", () =>
    Effect.gen(function* () {
      // the first heartbeat fails after 5 ms (its connection was terminated)
      const { calls, storage } = fakeStorage(5, 1)
      yield* runFor(storage, 700)
      assert.isAtLeast(calls.length, 2, `calls at ${calls}`)
      // failed at 305; retried 10 ms later, where the next round would come at 600
      assert.deepStrictEqual(calls.slice(0, 2), [300, 315])
    })
  )

  it.effect(
    "an attempt found closed is reported once and not heartbeated again; one let go is not heartbeated",
    () =>
      Effect.gen(function* () {
        // storage says attempt 1 is closed (cancelled or rescued elsewhere); 2 and 3 are open
        const items: Array<Array<string>> = []
        const heartbeatMany = (batch: ReadonlyArray<HeartbeatItem>) =>
          Effect.sync(() => {
            items.push(batch.map((i) => `${i.jobId}`))
            return batch.filter((i) => i.jobId === 1n).map((i) => ({ jobId: i.jobId, runLease: i.runLease }))
          })
        const scope = yield* Scope.make()
        const session = yield* Heartbeats.makeLoop({ intervalMs, maxStallMs: 600_000 }).pipe(
          Effect.provideService(QueueStorage, { heartbeatMany } as unknown as QueueStorage["Service"]),
          Scope.provide(scope)
        )
        session.track(1n, 1n, 0)
        session.track(2n, 1n, 0)
        const third = session.track(3n, 1n, 0)
        yield* TestClock.adjust(intervalMs)
        session.untrack(third)
        for (let t = 0; t < 3 * intervalMs; t += 10) yield* TestClock.adjust(10)
        const closed = yield* Stream.runCollect(Stream.take(session.closed, 1))
        yield* Scope.close(scope, Exit.void)
        assert.deepStrictEqual(closed, [{ jobId: 1n, runLease: 1n }])
        // the first round writes all three; later rounds only 2: 1 was found closed, 3 let go
        assert.deepStrictEqual(items, [["1", "2", "3"], ["2"], ["2"], ["2"]])
      })
  )
})
