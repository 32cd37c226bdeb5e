/**
 * One dispatcher per queue: claims up to the free capacity, hands each job to the executor in
 * the worker's `FiberSet`, and sleeps until a wake-up (LISTEN/NOTIFY), freed capacity, or the
 * poll interval.
 *
 * **Guarantees** Never claims more than the queue's free capacity; a claim error is logged and
 * retried after the poll interval (the dispatcher never dies on a database error).
 */
import type { ClaimedJob } from "@awa/storage"
import { QueueStorage } from "@awa/storage"
import { Effect, FiberSet, Queue, Ref } from "effect"

export interface DispatcherConfig {
  readonly queue: string
  readonly maxConcurrency: number
  readonly pollIntervalMs: number
  readonly deadlineMs: number
  readonly agingIntervalMs: number
}

/** Longest wait for more capacity before claiming into a small free slot count. */
const claimLingerMs = 2

export interface Dispatcher<R> {
  /** Rings the doorbell: something may be claimable now. */
  readonly wake: Effect.Effect<void>
  /** The loop; runs until interrupted. */
  readonly loop: Effect.Effect<never, never, R>
  readonly inFlight: Effect.Effect<number>
}

export const make = Effect.fnUntraced(function* <R>(
  config: DispatcherConfig,
  fibers: FiberSet.FiberSet<unknown, unknown>,
  runJob: (job: ClaimedJob, release: Effect.Effect<void>) => Effect.Effect<void, never, R>
) {
  const storage = yield* QueueStorage
  const inFlight = yield* Ref.make(0)
  // Sliding queues of capacity 1: repeated rings while busy collapse into one.
  const wakeBell = yield* Queue.sliding<void>(1)
  const capacityBell = yield* Queue.sliding<void>(1)
  const ring = (bell: Queue.Queue<void>) => Effect.asVoid(Queue.offer(bell, undefined))
  const release = Effect.andThen(
    Ref.update(inFlight, (n) => n - 1),
    ring(capacityBell)
  )

  const waitForWork = Queue.take(wakeBell).pipe(Effect.timeoutOption(config.pollIntervalMs), Effect.asVoid)

  // Claiming one job per freed slot costs a round trip per job: with little capacity free, wait
  // briefly for more to free up (or for the linger to pass) so claims come in batches.
  const batchThreshold = Math.max(1, Math.floor(config.maxConcurrency / 4))
  let lingered = false

  const claimOnce = Effect.gen(function* () {
    const free = config.maxConcurrency - (yield* Ref.get(inFlight))
    if (free <= 0) {
      yield* Queue.take(capacityBell)
      return
    }
    if (free < batchThreshold && !lingered) {
      lingered = true
      yield* Queue.take(capacityBell).pipe(Effect.timeoutOption(claimLingerMs))
      return
    }
    lingered = false
    const claimed = yield* storage
      .claim({
        queue: config.queue,
        max: free,
        deadlineMs: config.deadlineMs,
        agingIntervalMs: config.agingIntervalMs
      })
      .pipe(
        Effect.catchCause((cause) =>
          Effect.logWarning(
            `claim failed on queue ${config.queue}; retrying after the poll interval`,
            cause
          ).pipe(
            Effect.andThen(Effect.sleep(config.pollIntervalMs)),
            Effect.as([] as ReadonlyArray<ClaimedJob>)
          )
        )
      )
    yield* Ref.update(inFlight, (n) => n + claimed.length)
    for (const job of claimed) yield* FiberSet.run(fibers, runJob(job, release))
    // A full batch means more may be waiting: claim again at once.
    if (claimed.length < free) yield* waitForWork
  })

  return {
    wake: ring(wakeBell),
    loop: Effect.forever(claimOnce).pipe(Effect.annotateLogs({ module: "Dispatcher", queue: config.queue })),
    inFlight: Ref.get(inFlight)
  } satisfies Dispatcher<R>
})
