/**
 * The completion batcher's calls (group commit): while a call is in flight, a partial batch waits
 * for it and grows, so the next call takes everything that came in meanwhile; only a full batch
 * (`maxBatch`) starts a second call beside the first. Two calls at once with what arrived during
 * one linger each cost the drain a third more transactions (CompletionBatcher.ts, `mayFlush`).
 * Storage is the simulation's, with `finalizeMany` held until the test lets each call return.
 */
import type { FinalizeItem } from "@awa/storage"
import { QueueStorage, SimQueueStorage } from "@awa/storage"
import { assert, describe, it } from "@effect/vitest"
import { Deferred, Effect } from "effect"
import { TestClock } from "effect/testing"
import * as CompletionBatcher from "../src/CompletionBatcher.ts"

/** Every call's items, and a gate per call that the test opens to let it return. */
const heldStorage = Effect.gen(function* () {
  const storage = yield* SimQueueStorage.make
  const calls: Array<ReadonlyArray<FinalizeItem>> = []
  const gates: Array<Deferred.Deferred<void>> = []
  let released = false
  const finalizeMany: typeof storage.finalizeMany = (items) =>
    Effect.gen(function* () {
      const gate = yield* Deferred.make<void>()
      calls.push(items)
      gates.push(gate)
      if (!released) yield* Deferred.await(gate)
      return items.map(() => ({ _tag: "Stale" as const }))
    })
  /** Every call returns from here on (before the batcher's scope flushes what is left). */
  const releaseAll = Effect.suspend(() => {
    released = true
    return Effect.forEach(gates, (gate) => Deferred.succeed(gate, undefined), { discard: true })
  })
  return { storage: { ...storage, finalizeMany }, calls, gates, releaseAll }
})

const token = (n: number) => ({ jobId: BigInt(n), runLease: 1n })

/** Lets the batcher's fibers run (the linger is on the TestClock). */
const settle = Effect.gen(function* () {
  for (let i = 0; i < 5; i++) {
    yield* TestClock.adjust("2 millis")
    yield* Effect.yieldNow
  }
})

describe("CompletionBatcher: one call at a time until a batch is full", () => {
  it.effect("items that arrive while a call is in flight go together in the next call", () =>
    Effect.gen(function* () {
      const { storage, calls, gates, releaseAll } = yield* heldStorage
      yield* Effect.scoped(
        Effect.gen(function* () {
          const batcher = yield* CompletionBatcher.make({ maxBatch: 100, concurrency: 2 })
          const submit = (n: number) =>
            batcher.submitThen(token(n), { _tag: "Complete" }, undefined, () => {})
          yield* submit(1)
          yield* settle
          assert.deepStrictEqual(
            calls.map((c) => c.length),
            [1]
          )
          // the first call is held: ten more arrive, each after a linger's worth of time
          for (let n = 2; n <= 11; n++) {
            yield* submit(n)
            yield* settle
          }
          // a partial batch does not start a second call beside the first
          assert.deepStrictEqual(
            calls.map((c) => c.length),
            [1]
          )
          yield* Deferred.succeed(gates[0]!, undefined)
          yield* settle
          assert.deepStrictEqual(
            calls.map((c) => c.map((i) => Number(i.jobId))),
            [[1], [2, 3, 4, 5, 6, 7, 8, 9, 10, 11]]
          )
        }).pipe(Effect.ensuring(releaseAll), Effect.provideService(QueueStorage, storage))
      )
    })
  )

  it.effect("a full batch starts a second call while the first is in flight", () =>
    Effect.gen(function* () {
      const { storage, calls, gates, releaseAll } = yield* heldStorage
      yield* Effect.scoped(
        Effect.gen(function* () {
          const batcher = yield* CompletionBatcher.make({ maxBatch: 4, concurrency: 2 })
          const submit = (n: number) =>
            batcher.submitThen(token(n), { _tag: "Complete" }, undefined, () => {})
          yield* submit(1)
          yield* settle
          // held first call; five more: one full batch of four, and one item in a new batch
          for (let n = 2; n <= 6; n++) yield* submit(n)
          yield* settle
          assert.deepStrictEqual(
            calls.map((c) => c.map((i) => Number(i.jobId))),
            [[1], [2, 3, 4, 5]]
          )
          // a partial batch is never a second call: it waits while either is in flight
          yield* Deferred.succeed(gates[0]!, undefined)
          yield* settle
          assert.deepStrictEqual(
            calls.map((c) => c.length),
            [1, 4]
          )
          yield* Deferred.succeed(gates[1]!, undefined)
          yield* settle
          assert.deepStrictEqual(
            calls.map((c) => c.length),
            [1, 4, 1]
          )
        }).pipe(Effect.ensuring(releaseAll), Effect.provideService(QueueStorage, storage))
      )
    })
  )

  it.effect("closing the scope flushes what is pending", () =>
    Effect.gen(function* () {
      const { storage, calls, releaseAll } = yield* heldStorage
      // no call is held here: the scope closes right after the submits, before any linger ends
      yield* releaseAll
      const finished: Array<number> = []
      yield* Effect.scoped(
        Effect.gen(function* () {
          const batcher = yield* CompletionBatcher.make({ maxBatch: 100, concurrency: 2 })
          for (let n = 1; n <= 3; n++)
            yield* batcher.submitThen(token(n), { _tag: "Complete" }, undefined, () => {
              finished.push(n)
            })
        }).pipe(Effect.provideService(QueueStorage, storage))
      )
      assert.deepStrictEqual(finished, [1, 2, 3])
      assert.deepStrictEqual(
        calls.flat().map((i) => Number(i.jobId)),
        [1, 2, 3]
      )
    })
  )

  it.effect(
    "offer queues at once while there is room, and refuses (queuing nothing) when full or closed",
    () =>
      Effect.gen(function* () {
        const { storage, calls, gates, releaseAll } = yield* heldStorage
        const answered: Array<number> = []
        const onFinalized = (n: number) => () => {
          answered.push(n)
        }
        const batcher = yield* Effect.scoped(
          Effect.gen(function* () {
            const batcher = yield* CompletionBatcher.make({ maxBatch: 100, capacity: 3, concurrency: 1 })
            assert.isTrue(batcher.offer(token(1), { _tag: "Complete" }, undefined, onFinalized(1)))
            yield* settle
            // the first call is held: two more fit, a fourth does not (capacity 3 counts the waiting)
            assert.isTrue(batcher.offer(token(2), { _tag: "Complete" }, undefined, onFinalized(2)))
            assert.isTrue(batcher.offer(token(3), { _tag: "Complete" }, undefined, onFinalized(3)))
            assert.isTrue(batcher.offer(token(4), { _tag: "Complete" }, undefined, onFinalized(4)))
            assert.isFalse(batcher.offer(token(5), { _tag: "Complete" }, undefined, onFinalized(5)))
            yield* Deferred.succeed(gates[0]!, undefined)
            yield* settle
            assert.deepStrictEqual(
              calls.map((c) => c.map((i) => Number(i.jobId))),
              [[1], [2, 3, 4]]
            )
            return batcher
          }).pipe(Effect.ensuring(releaseAll), Effect.provideService(QueueStorage, storage))
        )
        // every offered item got its answer, the refused one none; closed, nothing is taken
        assert.deepStrictEqual(answered, [1, 2, 3, 4])
        assert.isFalse(batcher.offer(token(6), { _tag: "Complete" }, undefined, onFinalized(6)))
        assert.deepStrictEqual(
          calls.flat().map((i) => Number(i.jobId)),
          [1, 2, 3, 4]
        )
      })
  )
})
