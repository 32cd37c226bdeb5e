/**
 * One storage round trip per batch of finalizations. `submit` resolves once the outcome is
 * durable: `Applied`, or `Stale` when rescue or cancel closed the attempt first. `submitThen`
 * queues the outcome and returns at once; its callback runs when the batch's call has returned
 * (the executor's hot path: no fiber waits per job for the acknowledgement, ADR 0031).
 *
 * **Gotchas** `submit` suspends while `capacity` items wait: release the worker's capacity first.
 * On scope close new submits fail with `CompletionBatcherClosed` and every pending batch is
 * flushed before the storage layer goes away.
 */

import type { AttemptToken, FinalizeItem, FinalizeResult, Outcome } from "@awa/storage"
import { QueueStorage } from "@awa/storage"
import { type Cause, Deferred, Duration, Effect, Exit, Queue, Schedule, Schema } from "effect"
import { SqlError } from "effect/sql"

export interface CompletionBatcherOptions {
  /** Pending finalizations before `submit` waits. Default 4,096. */
  readonly capacity?: number | undefined
  /** Items per storage call. Default 512 (bounds the per-attempt advisory locks one call holds). */
  readonly maxBatch?: number | undefined
  /** How long to wait for more items after the first. Default 1 ms. */
  readonly linger?: Duration.Input | undefined
  /**
   * Storage calls in flight at once, each with its own batch. Default 2. A call beyond the first
   * starts only for a full batch (`maxBatch` items): below that, items wait for the call in flight
   * and go together in the next one (group commit).
   */
  readonly concurrency?: number | undefined
}

export class CompletionBatcherClosed extends Schema.TaggedError<CompletionBatcherClosed>()(
  "CompletionBatcherClosed",
  {}
) {}

/**
 * Told of one item's outcome once its batch's call has returned: its result, or the call's
 * failure (after the retries). Runs synchronously on the flushing fiber: it must not throw.
 */
export type OnFinalized = (
  result: FinalizeResult | undefined,
  failure: Cause.Cause<unknown> | undefined
) => void

export interface CompletionBatcher {
  /** `progress`, when given, is written with the outcome (kept unless it completes the job). */
  readonly submit: (
    token: AttemptToken,
    outcome: Outcome,
    progress?: Readonly<Record<string, unknown>> | undefined
  ) => Effect.Effect<FinalizeResult, SqlError.SqlError | CompletionBatcherClosed | unknown>
  /**
   * Queues the outcome (waiting only while `capacity` items wait) and returns; `onFinalized`
   * runs once its batch's call has returned. A failed call is logged here, once per batch.
   */
  readonly submitThen: (
    token: AttemptToken,
    outcome: Outcome,
    progress: Readonly<Record<string, unknown>> | undefined,
    onFinalized: OnFinalized
  ) => Effect.Effect<void, CompletionBatcherClosed>
  /**
   * `submitThen` without an effect, when nothing need wait: queues the outcome and answers true
   * while the batcher is open and below `capacity`; answers false (queuing nothing) otherwise,
   * and the caller takes `submitThen`, which waits for room or fails. The executor's path for
   * every finished attempt: no effect is built for it (ADR 0031).
   */
  readonly offer: (
    token: AttemptToken,
    outcome: Outcome,
    progress: Readonly<Record<string, unknown>> | undefined,
    onFinalized: OnFinalized
  ) => boolean
}

/**
 * Items flushed by one storage call, with each item's callback at the same index. A callback
 * per item instead of a `Deferred` awaited by each submitter: no fiber suspends and resumes per
 * job for the acknowledgement.
 */
interface Batch {
  readonly items: Array<FinalizeItem>
  readonly done: Array<OnFinalized>
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
  const capacity = options.capacity ?? 4096
  const linger = options.linger ?? "1 millis"
  // Parsed once: `Effect.sleep("1 millis")` parses the string on every batch (seen in the drain
  // profile). An input that does not parse is left to `Effect.sleep` as before.
  const parsedLinger = Duration.fromInput(linger)
  const lingerSleep = Effect.sleep(parsedLinger._tag === "Some" ? parsedLinger.value : linger)

  // Plain mutable state, touched only between fiber yields on the JS thread. Batches fill in
  // order; at most `maxBatch` items each. A Deferred per batch instead of one per item: this is
  // per-job cost on the hot path.
  const batches: Array<Batch> = []
  let pending = 0
  let inFlight = 0
  let closed = false
  // Rung when a batch is opened and when a call ends with batches waiting; idle flushers sleep on it.
  const bell = yield* Queue.sliding<void>(1)
  // Submitters waiting for room all wait on the current one; replaced after each flush.
  let room = yield* Deferred.make<void>()

  const newBatch = (): Batch => ({ items: [], done: [] })

  /** Hands each item its result, or the call's failure; a throwing callback is a bug, logged. */
  const deliver = (batch: Batch, exit: Exit.Exit<ReadonlyArray<FinalizeResult>, unknown>) => {
    const defects: Array<unknown> = []
    for (let i = 0; i < batch.done.length; i++) {
      try {
        if (Exit.isSuccess(exit)) batch.done[i]!(exit.value[i], undefined)
        else batch.done[i]!(undefined, exit.cause)
      } catch (defect) {
        defects.push(defect)
      }
    }
    return defects
  }

  // One call's exit fans out: each item gets its own result, or the batch's error.
  const flush = (batch: Batch) =>
    storage.finalizeMany(batch.items).pipe(
      Effect.retry(retryLostConnection),
      Effect.exit,
      Effect.flatMap((exit) => {
        const defects = deliver(batch, exit)
        const failed = Exit.isFailure(exit)
          ? Effect.logWarning(
              `finalization of ${batch.items.length} attempts failed; they stay rescuable`,
              exit.cause
            )
          : Effect.void
        return defects.length === 0
          ? failed
          : Effect.andThen(failed, Effect.logError("a finalization callback threw", defects))
      }),
      // no stack trace: it would point here
      Effect.withSpan(
        "CompletionBatcher.flush",
        {
          attributes: { size: batch.items.length }
        },
        { captureStackTrace: false }
      )
    )

  const takeBatch = Effect.sync(() => {
    const batch = batches.shift()
    if (batch !== undefined) pending -= batch.items.length
    return batch
  })

  const flushNext = Effect.gen(function* () {
    const batch = yield* takeBatch
    if (batch === undefined) return false
    inFlight++
    yield* Effect.ensuring(
      flush(batch),
      Effect.sync(() => {
        inFlight--
        // a flusher waiting for this call to end (see `mayFlush`) takes what piled up meanwhile
        if (batches.length > 0) Queue.offerUnsafe(bell, undefined)
      })
    )
    const waiting = room
    room = Deferred.makeUnsafe<void>()
    yield* Deferred.succeed(waiting, undefined)
    return true
  })

  /**
   * A second call starts only for a full batch. A partial one waits for the call in flight and
   * grows meanwhile: in a 100,000-job drain on 2 cores, ~145 items per call instead of ~100, a
   * third fewer transactions, and 3-33 % more jobs/s in each of six interleaved runs (two calls
   * at once, each with what came in during one linger, cost more server time than one call).
   * Beyond what one call at a time can take, full batches go in parallel as before.
   */
  const mayFlush = () => batches.length > 0 && (inFlight === 0 || batches[0]!.items.length >= maxBatch)

  // Taken items must reach storage: only the wait for the first one is interruptible.
  const step = Effect.gen(function* () {
    while (!mayFlush()) yield* Queue.take(bell)
    yield* Effect.uninterruptible(Effect.andThen(lingerSleep, flushNext))
  })

  // Registered before the fork, so it runs after the loop stops: refuse new work, flush the rest.
  yield* Effect.addFinalizer(() =>
    Effect.gen(function* () {
      closed = true
      while (yield* flushNext) {}
    })
  )
  // While one call is on the server, the next batch fills and can go on another connection.
  for (let i = 0; i < (options.concurrency ?? 2); i++) {
    yield* step.pipe(
      Effect.forever,
      Effect.ignoreCause,
      Effect.annotateLogs({ module: "CompletionBatcher" }),
      Effect.forkScoped
    )
  }

  /** Adds the item to the open batch (or a new one); the caller has checked `closed` and room. */
  const enqueue = (
    token: AttemptToken,
    outcome: Outcome,
    progress: Readonly<Record<string, unknown>> | undefined,
    onFinalized: OnFinalized
  ) => {
    let batch = batches.at(-1)
    if (batch === undefined || batch.items.length >= maxBatch) {
      batch = newBatch()
      batches.push(batch)
      // a new batch wakes a flusher: an idle one flushes it, and when the new batch is not the
      // first, the one before is full, so a second call may start while the first is busy
      Queue.offerUnsafe(bell, undefined)
    }
    batch.items.push(
      progress === undefined
        ? { jobId: token.jobId, runLease: token.runLease, outcome }
        : { jobId: token.jobId, runLease: token.runLease, outcome, progress }
    )
    batch.done.push(onFinalized)
    pending++
  }

  const offer = (
    token: AttemptToken,
    outcome: Outcome,
    progress: Readonly<Record<string, unknown>> | undefined,
    onFinalized: OnFinalized
  ): boolean => {
    if (closed || pending >= capacity) return false
    enqueue(token, outcome, progress, onFinalized)
    return true
  }

  const submitThen = (
    token: AttemptToken,
    outcome: Outcome,
    progress: Readonly<Record<string, unknown>> | undefined,
    onFinalized: OnFinalized
  ): Effect.Effect<void, CompletionBatcherClosed> =>
    Effect.suspend(() => {
      if (offer(token, outcome, progress, onFinalized)) return Effect.void
      if (closed) return Effect.fail(new CompletionBatcherClosed())
      return Effect.andThen(Deferred.await(room), submitThen(token, outcome, progress, onFinalized))
    })

  const submit = (
    token: AttemptToken,
    outcome: Outcome,
    progress?: Readonly<Record<string, unknown>> | undefined
  ): Effect.Effect<FinalizeResult, unknown> =>
    Effect.suspend(() => {
      if (closed) return Effect.fail(new CompletionBatcherClosed())
      if (pending >= capacity) return Effect.andThen(Deferred.await(room), submit(token, outcome, progress))
      return Effect.callback<FinalizeResult, unknown>((resume) => {
        enqueue(token, outcome, progress, (result, failure) =>
          resume(failure === undefined ? Effect.succeed(result!) : Effect.failCause(failure))
        )
      })
    })
  return { submit, submitThen, offer } satisfies CompletionBatcher
})
