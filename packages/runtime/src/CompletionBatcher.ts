/**
 * One storage round trip per batch of finalizations. `submit` resolves once the outcome is
 * durable: `Applied`, or `Stale` when rescue or cancel closed the attempt first.
 *
 * **Gotchas** `submit` suspends while `capacity` items wait: release the worker's capacity first.
 * On scope close the queue is ended and whatever is pending is flushed before the storage layer
 * goes away.
 */

import type { AttemptToken, FinalizeResult, Outcome } from "@awa/storage"
import { QueueStorage } from "@awa/storage"
import { type Cause, Deferred, type Duration, Effect, Exit, Queue, Schedule, Schema } from "effect"
import { SqlError } from "effect/sql"

export interface CompletionBatcherOptions {
  /** Pending finalizations before `submit` waits. Default 4,096. */
  readonly capacity?: number | undefined
  /** Items per storage call. Default 512 (bounds the per-attempt advisory locks one call holds). */
  readonly maxBatch?: number | undefined
  /** How long to wait for more items after the first. Default 1 ms. */
  readonly linger?: Duration.Input | undefined
}

export class CompletionBatcherClosed extends Schema.TaggedError<CompletionBatcherClosed>()(
  "CompletionBatcherClosed",
  {}
) {}

export interface CompletionBatcher {
  readonly submit: (
    token: AttemptToken,
    outcome: Outcome
  ) => Effect.Effect<FinalizeResult, SqlError.SqlError | CompletionBatcherClosed | unknown>
}

interface Pending {
  readonly token: AttemptToken
  readonly outcome: Outcome
  readonly done: Deferred.Deferred<FinalizeResult, unknown>
}

/**
 * A flush lost with its connection (backend terminated, server restarting) is retried for about
 * 6 s before giving up: otherwise every attempt of the batch, though finished, stays open until
 * rescued as stale and runs again (fault suite, scenarios 2 and 3). Safe because `finalize` is
 * guarded by each attempt's run lease: if the lost call did commit, the retry reports its items
 * `Stale` and changes nothing. Only `SqlError`s are retried (not a `ValidationError`).
 */
const retryLostConnection = Schedule.min([
  Schedule.exponential("50 millis"),
  Schedule.spaced("1 second")
]).pipe(
  Schedule.upTo({ times: 10 }),
  Schedule.setInputType<unknown>(),
  Schedule.while(({ input }) => SqlError.isSqlError(input))
)

export const make = Effect.fnUntraced(function* (options: CompletionBatcherOptions = {}) {
  const storage = yield* QueueStorage
  const maxBatch = options.maxBatch ?? 512
  const pending = yield* Queue.bounded<Pending, Cause.Done>(options.capacity ?? 4096)

  // One call's exit fans out: each waiter gets its own result, or the batch's error.
  const flush = (batch: ReadonlyArray<Pending>) =>
    storage.finalizeMany(batch.map(({ token, outcome }) => ({ ...token, outcome }))).pipe(
      Effect.retry(retryLostConnection),
      Effect.exit,
      Effect.flatMap((exit) =>
        Effect.forEach(
          batch,
          (p, i) =>
            Deferred.done(
              p.done,
              Exit.map(exit, (results) => results[i]!)
            ),
          { discard: true }
        )
      ),
      Effect.withSpan("CompletionBatcher.flush", { attributes: { size: batch.length } })
    )

  // Taken items must reach storage: only the wait for the first one is interruptible.
  const step = Effect.uninterruptibleMask((restore) =>
    Effect.gen(function* () {
      const first = yield* restore(Queue.takeBetween(pending, 1, maxBatch))
      yield* Effect.sleep(options.linger ?? "1 millis")
      const rest = yield* Queue.takeBetween(pending, 0, maxBatch - first.length)
      yield* flush([...first, ...rest])
    })
  )

  // Registered before the fork, so it runs after the loop stops: refuse new work, flush the rest.
  yield* Effect.addFinalizer(() =>
    Effect.gen(function* () {
      yield* Queue.end(pending)
      const left = yield* Queue.clear(pending)
      for (let i = 0; i < left.length; i += maxBatch) yield* flush(left.slice(i, i + maxBatch))
    })
  )
  yield* step.pipe(
    Effect.forever,
    Effect.ignoreCause,
    Effect.annotateLogs({ module: "CompletionBatcher" }),
    Effect.forkScoped
  )

  const submit = (token: AttemptToken, outcome: Outcome) =>
    Effect.gen(function* () {
      const done = yield* Deferred.make<FinalizeResult, unknown>()
      const offered = yield* Queue.offer(pending, { token, outcome, done })
      if (!offered) return yield* new CompletionBatcherClosed()
      return yield* Deferred.await(done)
    })
  return { submit } satisfies CompletionBatcher
})
