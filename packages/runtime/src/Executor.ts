/**
 * Runs one claimed attempt: decodes its args, runs its handler under the queue's deadline, maps
 * the exit to an `Outcome` and hands it to the `CompletionBatcher`.
 *
 * **Guarantees**
 * - Every attempt that starts ends in exactly one submitted outcome, unless it was closed
 *   elsewhere (cancel or rescue broadcast, heartbeat reply), in which case it is interrupted and
 *   nothing is submitted: storage would report it stale anyway.
 * - Interruption by shutdown submits a retry (`interrupted: worker shutting down`).
 * - The worker's capacity is released before waiting for the durable acknowledgement; the
 *   attempt leaves the running registry (heartbeats) only after it.
 */
import { Backoff, Job, Traceparent } from "@awa/core"
import type { AttemptToken, ClaimedJob, Outcome } from "@awa/storage"
import { Cause, Clock, Duration, Effect, Exit, Fiber, Random, Schema, Tracer } from "effect"
import type { CompletionBatcher } from "./CompletionBatcher.ts"
import type { Handler, JobContext } from "./Handler.ts"

export interface ExecutorOptions<R> {
  readonly handlers: ReadonlyMap<string, Handler<R>>
  /** What to do with a job whose kind has no handler here. Default "fail". */
  readonly onUnknownKind: "fail" | "retry"
  readonly batcher: CompletionBatcher
  /** Wrap each attempt in a consumer span carrying `awa:traceparent`; off = no span at all. Default true. */
  readonly tracing: boolean
  /** Writes progress not yet carried by a heartbeat, before the outcome is submitted. */
  readonly flushProgress: (
    token: AttemptToken,
    progress: Readonly<Record<string, unknown>>
  ) => Effect.Effect<unknown, unknown>
}

/** An attempt running in this process. */
export interface RunningAttempt {
  readonly job: ClaimedJob
  readonly startedAt: number
  progress: Readonly<Record<string, unknown>> | undefined
  /** Progress changed since the last heartbeat wrote it. */
  progressDirty: boolean
  fiber: Fiber.Fiber<unknown, unknown> | undefined
  /** Set when the attempt was closed elsewhere: its outcome is not submitted. */
  closedElsewhere: boolean
}

const key = (jobId: bigint, runLease: bigint) => `${jobId}:${runLease}`
const maxDelayMs = 30 * 24 * 60 * 60 * 1000

class DeadlineExceeded extends Schema.TaggedError<DeadlineExceeded>()("DeadlineExceeded", {}) {}
class ArgsUndecodable extends Schema.TaggedError<ArgsUndecodable>()("ArgsUndecodable", {
  message: Schema.String
}) {}

const messageOf = (error: unknown): string => {
  if (error instanceof Error) return error.message || error.name
  if (typeof error === "object" && error !== null && "message" in error)
    return String((error as { message: unknown }).message)
  return String(error)
}

export const make = <R>(options: ExecutorOptions<R>) => {
  const running = new Map<string, RunningAttempt>()

  // Delays come from user code (a custom backoff, a handler's RetryAfter/Snooze) and may be
  // anything, or throw. Storage takes whole milliseconds 0 – 30 days and rejects a finalize call
  // holding anything else, which fails every other attempt of that batch; and a throw escaping
  // here would skip `release` and leave the attempt heartbeating forever, never finalized (fault
  // suite, scenario 6). So delays are parsed without throwing, rounded and range-checked.
  const millisOf = (input: () => Duration.Input): number | undefined => {
    try {
      const ms = Duration.toMillis(Duration.fromInputUnsafe(input()))
      return Number.isNaN(ms) ? undefined : ms
    } catch {
      return undefined
    }
  }

  const backoffMs = (handler: Handler<R> | undefined, attempt: number) =>
    Effect.gen(function* () {
      const custom = handler?.definition.backoff
      const ms = custom === undefined ? undefined : millisOf(() => custom(attempt))
      // clamped into range; a backoff that throws or is not a duration gets the default
      if (ms !== undefined) return Math.min(Math.max(0, Math.round(ms)), maxDelayMs)
      return Backoff.defaultBackoffMs(attempt, yield* Random.next)
    })

  const delayOf = (delay: Duration.Input): number | undefined => {
    const ms = millisOf(() => delay)
    return ms !== undefined && Number.isFinite(ms) && ms >= 0 && ms <= maxDelayMs ? Math.round(ms) : undefined
  }

  /** Maps a handler's exit to what storage should record. */
  const outcomeOf = (
    handler: Handler<R> | undefined,
    job: ClaimedJob,
    exit: Exit.Exit<Job.JobResult | void, unknown>
  ) =>
    Effect.gen(function* (): Effect.fn.Return<Outcome> {
      const retry = (message: string) =>
        Effect.map(
          backoffMs(handler, job.attempt),
          (delayMs): Outcome => ({ _tag: "Retry", delayMs, error: message })
        )
      if (Exit.isSuccess(exit)) {
        const result = exit.value
        if (result === undefined || result._tag === "Completed") return { _tag: "Complete" }
        if (result._tag === "Cancel") return { _tag: "Cancel", reason: result.reason }
        const delayMs = delayOf(result.delay)
        if (delayMs === undefined)
          return yield* retry(`invalid handler outcome: ${result._tag} delay out of 0 ms – 30 days`)
        return result._tag === "Snooze"
          ? { _tag: "Snooze", delayMs }
          : { _tag: "Retry", delayMs, error: result.reason }
      }
      const error = Cause.findErrorOption(exit.cause)
      if (error._tag === "Some") {
        const e = error.value
        if (e instanceof DeadlineExceeded) return yield* retry("hard deadline exceeded")
        if (e instanceof ArgsUndecodable)
          return { _tag: "Fail", error: `args failed to decode: ${e.message}` }
        if (e instanceof Job.JobTerminalError) return { _tag: "Fail", error: e.message }
        return yield* retry(messageOf(e))
      }
      if (Cause.hasInterruptsOnly(exit.cause)) return yield* retry("interrupted: worker shutting down")
      return yield* retry(`defect: ${Cause.pretty(exit.cause).split("\n")[0]}`)
    })

  /** The handler's own effect, with decoding, deadline, abort signal and span. */
  const attempt = (handler: Handler<R>, job: ClaimedJob, entry: RunningAttempt) =>
    Effect.gen(function* () {
      const args = yield* Schema.decodeUnknownEffect(handler.definition.args)(job.args).pipe(
        Effect.mapError((e) => new ArgsUndecodable({ message: e.message }))
      )
      const controller = new AbortController()
      const ctx: JobContext = {
        job: {
          id: job.jobId,
          kind: job.kind,
          queue: job.queue,
          attempt: job.attempt,
          maxAttempts: job.maxAttempts,
          runLease: job.runLease,
          metadata: job.metadata,
          tags: job.tags,
          errors: job.errors
        },
        signal: controller.signal,
        setProgress: (progress) =>
          Effect.sync(() => {
            entry.progress = progress
            entry.progressDirty = true
          })
      }
      const run = handler.run(args, ctx).pipe(Effect.onInterrupt(() => Effect.sync(() => controller.abort())))
      if (job.deadlineAt === null) return yield* run
      const remaining = Math.max(0, job.deadlineAt.getTime() - job.claimedAt.getTime())
      return yield* Effect.timeoutOrElse(run, {
        duration: remaining,
        orElse: () =>
          Effect.sync(() => controller.abort()).pipe(Effect.andThen(Effect.fail(new DeadlineExceeded())))
      })
    })

  /** Wraps the attempt in a consumer span: child of the producer's span on attempt 1, linked after. */
  const traced = <A, E>(job: ClaimedJob, effect: Effect.Effect<A, E, R>) => {
    // With tracing off there is no span at all: a span per attempt is measurable per-job cost.
    if (!options.tracing) return effect
    const attributes = {
      "messaging.system": "awa",
      "messaging.operation.type": "process",
      "messaging.destination.name": job.queue,
      "messaging.message.id": String(job.jobId),
      "awa.job.kind": job.kind,
      "awa.job.attempt": job.attempt
    }
    const producer = Traceparent.decode(job.metadata[Traceparent.metadataKey])
    if (producer === undefined)
      return Effect.withSpan(effect, `process ${job.kind}`, { kind: "consumer", attributes })
    const external = Tracer.externalSpan(producer)
    return job.attempt <= 1
      ? Effect.withSpan(effect, `process ${job.kind}`, { kind: "consumer", attributes, parent: external })
      : Effect.withSpan(effect, `process ${job.kind}`, {
          kind: "consumer",
          attributes,
          root: true,
          links: [{ span: external, attributes: { "awa.link": "producer" } }]
        })
  }

  /**
   * Runs one attempt to its durable outcome. `release` frees the worker's capacity; it is called
   * exactly once, before the outcome is acknowledged.
   */
  const run = (job: ClaimedJob, release: Effect.Effect<void>) =>
    Effect.uninterruptibleMask((restore) =>
      Effect.gen(function* () {
        const handler = options.handlers.get(job.kind)
        const entry: RunningAttempt = {
          job,
          startedAt: yield* Clock.currentTimeMillis,
          progress: undefined,
          progressDirty: false,
          fiber: undefined,
          closedElsewhere: false
        }
        running.set(key(job.jobId, job.runLease), entry)
        let exit: Exit.Exit<Job.JobResult | void, unknown>
        if (handler === undefined) {
          exit =
            options.onUnknownKind === "fail"
              ? Exit.fail(new Job.JobTerminalError({ message: `unknown job kind: ${job.kind}` }))
              : Exit.fail(new Error(`unknown job kind: ${job.kind}`))
        } else {
          const fiber = yield* Effect.forkChild(restore(traced(job, attempt(handler, job, entry))), {
            startImmediately: true
          })
          entry.fiber = fiber
          exit = yield* Effect.exit(restore(Fiber.join(fiber)))
          if (Exit.isFailure(exit) && Cause.hasInterrupts(exit.cause)) yield* Fiber.interrupt(fiber)
        }
        // Whatever the handler returned (even `null`), the attempt must reach `release` and an
        // outcome: an unexpected failure of the mapping itself becomes a retry with its reason.
        const outcome = yield* outcomeOf(handler, job, exit).pipe(
          Effect.catchCause((cause) =>
            Effect.map(
              backoffMs(handler, job.attempt),
              (delayMs): Outcome => ({
                _tag: "Retry",
                delayMs,
                error: `invalid handler outcome: ${Cause.pretty(cause).split("\n")[0]}`
              })
            )
          )
        )
        yield* release
        if (!entry.closedElsewhere) {
          yield* options.batcher
            .submit(job, outcome)
            .pipe(
              Effect.catchCause((cause) =>
                Effect.logWarning("finalization failed; the attempt stays rescuable", cause)
              )
            )
        }
        running.delete(key(job.jobId, job.runLease))
      })
    )

  /**
   * Interrupts an attempt closed elsewhere (cancel, rescue); nothing is submitted for it.
   * Signals the interruption without waiting for the handler to stop: callers are the heartbeat
   * loop and the notification listener, and a handler that ignores interruption (an
   * uninterruptible region) would hold them up — no heartbeats for any other attempt of this
   * process (all rescued as stale: fault suite, scenario 5) and no wake-ups or cancels meanwhile.
   */
  const interrupt = (jobId: bigint, runLease: bigint) =>
    Effect.suspend(() => {
      const entry = running.get(key(jobId, runLease))
      if (entry === undefined) return Effect.void
      entry.closedElsewhere = true
      return entry.fiber === undefined
        ? Effect.void
        : Effect.asVoid(Effect.forkDetach(Fiber.interrupt(entry.fiber), { startImmediately: true }))
    })

  return { run, interrupt, running: running as ReadonlyMap<string, RunningAttempt> }
}

export type Executor<R> = ReturnType<typeof make<R>>
