/**
 * Holds the attempts this process claimed and runs each on its own fiber: decodes its args, runs
 * its handler under the queue's deadline, maps the exit to an `Outcome` and hands it to the
 * `CompletionBatcher`.
 *
 * **Guarantees**
 * - A held attempt (claimed, maybe still waiting for capacity) is heartbeated and honours cancel
 *   and rescue broadcasts from the moment it is held; one closed before it starts never runs.
 * - Every attempt that starts ends in exactly one submitted outcome, unless it was closed
 *   elsewhere (cancel or rescue broadcast, heartbeat reply), in which case it is interrupted and
 *   nothing is submitted: storage would report it stale anyway.
 * - Interruption by shutdown releases the attempt: runnable again at once, the attempt not counted,
 *   its error entry `interrupted: worker shutting down` (capabilities.md §7). A deploy never
 *   fails a job, even one on its last attempt.
 * - The worker's capacity is released before waiting for the durable acknowledgement; the
 *   attempt leaves the running registry (heartbeats) only after it.
 * - An attempt's progress (capability 14) is submitted with its outcome and written in the same
 *   statement, so a checkpoint set just before a failure reaches the next attempt
 *   (`ctx.job.progress`); heartbeats and `ctx.flushProgress` write it earlier.
 * - A held attempt is in the heartbeats' table (shared memory the heartbeat thread reads: no
 *   message per attempt) from the moment it is held, before it starts: a handler blocking the
 *   event loop from its first line is already covered.
 */
import { Backoff, CallbackStale, Job, ProgressTooLarge, Traceparent, ValidationError } from "@awa/core"
import type { CallbackStorage, ClaimedJob, Heartbeats, Outcome, ResumedJob } from "@awa/storage"
import {
  Cause,
  Deferred,
  Duration,
  Effect,
  Exit,
  Fiber,
  FiberSet,
  Option,
  Random,
  Schema,
  Tracer
} from "effect"
import type { SqlError } from "effect/sql"
import * as CallbackCel from "./CallbackCel.ts"
import type { CompletionBatcher, OnFinalized } from "./CompletionBatcher.ts"
import * as Deadlines from "./Deadlines.ts"
import type { Handler, JobContext } from "./Handler.ts"
import * as Progress from "./Progress.ts"
import * as RuntimeMetrics from "./RuntimeMetrics.ts"

export interface ExecutorOptions<R> {
  readonly handlers: ReadonlyMap<string, Handler<R>>
  /** What to do with a job whose kind has no handler here: a counted retry with backoff, or fail. */
  readonly onUnknownKind: "fail" | "retry"
  readonly batcher: CompletionBatcher
  /** Wrap each attempt in a consumer span carrying `awa:traceparent`; off = no span at all. Default true. */
  readonly tracing: boolean
  /** Largest progress a handler may set, in UTF-8 bytes of its JSON (`maxProgressBytes`). */
  readonly maxProgressBytes: number
  /**
   * Heartbeats of the held attempts (on a thread of their own, or on the event loop): told of
   * every attempt held and forgotten and of progress changes; writes `ctx.flushProgress`.
   */
  readonly heartbeats: Pick<Heartbeats.HeartbeatSession, "track" | "untrack" | "progress" | "flush">
  /**
   * True once the worker's drain is over and it interrupts what still runs: an interruption is
   * then a release (attempt not counted), any other interruption an ordinary retry. Default: never.
   */
  readonly shuttingDown?: (() => boolean) | undefined
  /** Told of every outcome storage applied (synchronously, after the acknowledgement). */
  readonly onApplied?: ((job: ClaimedJob) => void) | undefined
  /** Callbacks (capabilities.md §17); without them `ctx.registerCallback` dies. */
  readonly callbacks?: CallbackStorage["Service"] | undefined
}

/** An attempt running in this process. */
export interface RunningAttempt {
  readonly job: ClaimedJob
  /** When this process received the claim. */
  readonly heldAt: number
  /** This attempt's progress; unset until the handler sets some (the base is `job.progress`). */
  progress: Progress.JobProgress | undefined
  /** Bumped by every change of `progress`. */
  progressGeneration: number
  /**
   * The newest generation known to be written: a write acknowledges the generation it carried,
   * never a newer one set while it was in flight, and nothing is written while they are equal.
   */
  progressWritten: number
  /** The attempt's own fiber: set when its body begins, cleared when the body ends (`settle`). */
  fiber: Fiber.Fiber<unknown, unknown> | undefined
  /** Created when the handler first reads `ctx.signal`; aborted when the attempt is interrupted. */
  controller: AbortController | undefined
  /** Its fiber has begun running (until then, an interruption would skip its exit handler). */
  begun: boolean
  /** Set when the attempt was closed elsewhere: its outcome is not submitted. */
  closedElsewhere: boolean
  /** Set when its hard deadline passed: the interruption is recorded as a retry. */
  deadlineExceeded: boolean
  deadline: Deadlines.DeadlineNode | undefined
  /** `performance.now()` when its handler began (the handler duration metric). */
  startedAt: number | undefined
  /** Completed by a resume notification for this attempt while its handler waits in `waitForCallback`. */
  callbackWake: Deferred.Deferred<void> | undefined
  readonly key: string
  /** Its handle in the heartbeats' table. */
  readonly held: number
}

const keyOf = (jobId: bigint, runLease: bigint) => `${jobId}:${runLease}`
const complete: Outcome = { _tag: "Complete" }
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

/**
 * A handler's `JobContext`, built lazily: most handlers read nothing from it, and the objects of
 * an eager context were measurable allocation per job. Members are getters returning plain values
 * or closures, so destructuring (`const { signal } = ctx`) works.
 */
class AttemptContext implements JobContext {
  readonly #entry: RunningAttempt
  readonly #progress: ProgressOps
  readonly #callbacks: CallbackOps
  #job: JobContext["job"] | undefined
  constructor(entry: RunningAttempt, progress: ProgressOps, callbacks: CallbackOps) {
    this.#entry = entry
    this.#progress = progress
    this.#callbacks = callbacks
  }
  get registerCallback(): JobContext["registerCallback"] {
    return (options) => this.#callbacks.register(this.#entry, options)
  }
  get waitForCallback(): JobContext["waitForCallback"] {
    return (token) => this.#callbacks.wait(this.#entry, token)
  }
  get callbackResult(): unknown {
    const job = this.#entry.job as Partial<ResumedJob>
    return "callbackResult" in job ? job.callbackResult : undefined
  }
  get job(): JobContext["job"] {
    const job = this.#entry.job
    this.#job ??= {
      id: job.jobId,
      kind: job.kind,
      queue: job.queue,
      attempt: job.attempt,
      maxAttempts: job.maxAttempts,
      runLease: job.runLease,
      metadata: job.metadata,
      tags: job.tags,
      errors: job.errors,
      progress: job.progress
    }
    return this.#job
  }
  /** Created on first use; aborted by the exit handler when the attempt is interrupted. */
  get signal(): AbortSignal {
    this.#entry.controller ??= new AbortController()
    return this.#entry.controller.signal
  }
  get setProgress(): JobContext["setProgress"] {
    const entry = this.#entry
    const ops = this.#progress
    return (percent, message) =>
      Effect.suspend(() =>
        setTo(entry, Progress.withPercent(currentProgress(entry), percent, message, ops.maxBytes), ops)
      )
  }
  get updateMetadata(): JobContext["updateMetadata"] {
    const entry = this.#entry
    const ops = this.#progress
    return (patch) =>
      Effect.suspend(() =>
        setTo(entry, Progress.withMetadata(currentProgress(entry), patch, ops.maxBytes), ops)
      )
  }
  get flushProgress(): JobContext["flushProgress"] {
    return this.#progress.flush(this.#entry)
  }
}

interface CallbackOps {
  readonly register: (
    entry: RunningAttempt,
    options: Parameters<JobContext["registerCallback"]>[0]
  ) => ReturnType<JobContext["registerCallback"]>
  readonly wait: (
    entry: RunningAttempt,
    token: Job.CallbackToken
  ) => ReturnType<JobContext["waitForCallback"]>
}

/** How often an in-handler wait looks again when no notification came (capabilities.md §17). */
const callbackPollMs = 1000

interface ProgressOps {
  readonly maxBytes: number
  readonly flush: (entry: RunningAttempt) => Effect.Effect<void, SqlError.SqlError>
  /** Called after every change: the next heartbeat carries it. */
  readonly changed: (entry: RunningAttempt) => void
}

/** What `setProgress` and `updateMetadata` build on: this attempt's value, else the checkpoint it started from. */
const currentProgress = (entry: RunningAttempt): Progress.JobProgress | null =>
  entry.progress ?? (entry.job.progress as Progress.JobProgress | null)

const setTo = (
  entry: RunningAttempt,
  next: Progress.JobProgress | ValidationError | ProgressTooLarge,
  ops: ProgressOps
): Effect.Effect<void, ValidationError | ProgressTooLarge> => {
  if (next instanceof ValidationError || next instanceof ProgressTooLarge) return Effect.fail(next)
  entry.progress = next
  entry.progressGeneration++
  ops.changed(entry)
  return Effect.void
}

export const make = Effect.fnUntraced(function* <R>(options: ExecutorOptions<R>) {
  const running = new Map<string, RunningAttempt>()
  const deadlines = yield* Deadlines.make()
  const metrics = yield* RuntimeMetrics.makeRecorder

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

  /** Maps a handler's exit to what storage should record (`settle` takes completions itself). */
  const outcomeOf = (
    handler: Handler<R> | undefined,
    entry: RunningAttempt,
    exit: Exit.Exit<Job.JobResult | void, unknown>
  ) =>
    Effect.gen(function* (): Effect.fn.Return<Outcome> {
      const job = entry.job
      const retry = (message: string) =>
        Effect.map(
          backoffMs(handler, job.attempt),
          (delayMs): Outcome => ({ _tag: "Retry", delayMs, error: message })
        )
      if (Exit.isSuccess(exit)) {
        const result = exit.value
        if (result === undefined || result._tag === "Completed") return { _tag: "Complete" }
        if (result._tag === "Cancel") return { _tag: "Cancel", reason: result.reason }
        if (result._tag === "WaitForCallback")
          return yield* retry("waitForCallback: callbacks need a storage layer that provides CallbackStorage")
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
      if (Cause.hasInterruptsOnly(exit.cause)) {
        if (entry.deadlineExceeded) return yield* retry("hard deadline exceeded")
        // Shutdown is not the job's fault: it runs again at once, the attempt not counted. A
        // handler interrupting itself (not shutdown) still uses an attempt, so it cannot loop.
        return options.shuttingDown?.() === true
          ? { _tag: "Release", delayMs: 0, error: "interrupted: worker shutting down" }
          : yield* retry("interrupted")
      }
      return yield* retry(`defect: ${Cause.pretty(exit.cause).split("\n")[0]}`)
    })

  // Decoders built once per kind, not per attempt.
  const decoders = new Map<string, (input: unknown) => Effect.Effect<unknown, Schema.SchemaError>>()
  const decoderOf = (handler: Handler<R>) => {
    let decode = decoders.get(handler.definition.kind)
    if (decode === undefined) {
      // the codec insert encoded with (core `argsCodec`): every Schema round-trips
      decode = Schema.decodeUnknownEffect(Job.argsCodec(handler.definition.args)) as (
        input: unknown
      ) => Effect.Effect<unknown, Schema.SchemaError>
      decoders.set(handler.definition.kind, decode)
    }
    return decode
  }

  /**
   * Writes the attempt's progress when it changed since the last write; acknowledges only the
   * generation it carried.
   */
  const flushProgress = (entry: RunningAttempt): Effect.Effect<void, SqlError.SqlError> =>
    Effect.suspend(() => {
      const progress = entry.progress
      const generation = entry.progressGeneration
      if (progress === undefined || generation <= entry.progressWritten) return Effect.void
      return Effect.map(options.heartbeats.flush(entry.held, progress, generation), () => {
        if (generation > entry.progressWritten) entry.progressWritten = generation
      })
    })
  const progressOps: ProgressOps = {
    maxBytes: options.maxProgressBytes,
    flush: flushProgress,
    changed: (entry) => options.heartbeats.progress(entry.held, entry.progress!, entry.progressGeneration)
  }

  const callbackStorage = () =>
    options.callbacks === undefined
      ? Effect.die(new Error("callbacks need a storage layer that provides CallbackStorage"))
      : Effect.succeed(options.callbacks)
  const callbackOps: CallbackOps = {
    register: (entry, o) =>
      Effect.gen(function* () {
        const storage = yield* callbackStorage()
        const timeout = Duration.fromInput(o.timeout)
        if (timeout._tag === "None")
          return yield* new ValidationError({ field: "timeout", reason: "is not a duration" })
        const expressions = {
          filter: o.filter,
          onComplete: o.onComplete,
          onFail: o.onFail,
          transform: o.transform
        }
        yield* CallbackCel.check(expressions)
        const id = yield* storage.register(entry.job, {
          timeoutMs: Math.round(Duration.toMillis(timeout.value)),
          expressions
        })
        if (Option.isNone(id))
          return yield* new CallbackStale({ callbackId: `${entry.key} (attempt closed)` })
        return { id: id.value }
      }),
    wait: (entry, token) =>
      Effect.gen(function* () {
        const storage = yield* callbackStorage()
        while (true) {
          // armed before the look, so a resume between the look and the wait still wakes it
          const wake = yield* Deferred.make<void>()
          entry.callbackWake = wake
          const found = yield* storage.take(entry.job, token.id)
          if (found._tag === "Resumed") return found.payload
          if (found._tag === "Stale") return yield* new CallbackStale({ callbackId: token.id })
          yield* Deferred.await(wake).pipe(Effect.timeoutOption(callbackPollMs))
        }
      }).pipe(
        Effect.ensuring(
          Effect.sync(() => {
            entry.callbackWake = undefined
          })
        )
      )
  }

  /** The context a handler sees. */
  const contextOf = (entry: RunningAttempt): JobContext => new AttemptContext(entry, progressOps, callbackOps)

  const undecodable = (e: Schema.SchemaError) => new ArgsUndecodable({ message: e.message })

  /**
   * The handler's own effect, after decoding its args. Its deadline is enforced by `deadlines`,
   * and its signal aborted by `settle`, both through this fiber's interruption.
   */
  const attempt = (handler: Handler<R>, entry: RunningAttempt) =>
    Effect.flatMap(Effect.mapError(decoderOf(handler)(entry.job.args), undecodable), (args) =>
      handler.run(args, contextOf(entry))
    )

  /**
   * With tracing on (off, there is no span at all: a span per attempt is measurable per-job cost),
   * wraps the attempt in a consumer span: child of the producer's span on attempt 1, linked after.
   * `exported` is false under Effect's default `nativeTracer` (no tracer installed): the span is
   * then made only for a job that carries a producer's traceparent, so a handler or logger still
   * reads that trace id from `Effect.currentSpan`, and without the attributes only an installed
   * tracer could export (issue 17, ADR 0031, ADR 0043). No stack trace in either case: it would
   * only ever point here (as for the producer span).
   */
  const traced = <A, E>(job: ClaimedJob, effect: Effect.Effect<A, E, R>, exported: boolean) => {
    const attributes = exported
      ? {
          "messaging.system": "awa",
          "messaging.operation.type": "process",
          "messaging.destination.name": job.queue,
          "messaging.message.id": String(job.jobId),
          "awa.job.kind": job.kind,
          "awa.job.attempt": job.attempt
        }
      : undefined
    const producer = Traceparent.decode(job.metadata[Traceparent.metadataKey])
    const external = producer === undefined ? undefined : Tracer.externalSpan(producer)
    const options: Tracer.SpanOptionsNoTrace =
      external === undefined
        ? { kind: "consumer", attributes }
        : job.attempt <= 1
          ? { kind: "consumer", attributes, parent: external }
          : {
              kind: "consumer",
              attributes,
              root: true,
              links: [{ span: external, attributes: { "awa.link": "producer" } }]
            }
    // `useSpan` and the parent span provided directly, not `withSpan`: that also provides a
    // stack frame for the span (a second copy of the fiber's context per attempt), which only
    // serves a captured stack trace, and there is none here.
    return Effect.useSpan(`process ${job.kind}`, options, (span) =>
      Effect.provideService(effect, Tracer.ParentSpan, span)
    )
  }

  /** Forgets a finished attempt: no more heartbeats, deadline or broadcasts for it. */
  const forget = (entry: RunningAttempt) => {
    running.delete(entry.key)
    options.heartbeats.untrack(entry.held)
    if (entry.deadline !== undefined) deadlines.remove(entry.deadline)
  }

  /** Past its deadline: a running attempt is interrupted (recorded as a retry); a waiting one never starts. */
  const expire = (entry: RunningAttempt) => () => {
    entry.deadlineExceeded = true
    return interruptIfBegun(entry)
  }

  /**
   * Interrupts the attempt's fiber once it has begun. A fiber interrupted before it begins never
   * runs its exit handler (no release, no outcome), so one not yet begun is left to see the flags
   * set by the caller when it does.
   */
  const interruptIfBegun = (entry: RunningAttempt) =>
    entry.fiber === undefined || !entry.begun
      ? Effect.void
      : Effect.asVoid(Effect.forkDetach(Fiber.interrupt(entry.fiber), { startImmediately: true }))

  /**
   * Takes a claimed attempt into this process: from here on it is heartbeated, its deadline runs,
   * and a cancel or rescue broadcast for it is honoured even before it starts. `heldAt` is when
   * the claim came back. The deadline counts from then, as storage's does from the claim.
   */
  const hold = (job: ClaimedJob, heldAt: number): RunningAttempt => {
    const entry: RunningAttempt = {
      job,
      heldAt,
      progress: undefined,
      progressGeneration: 0,
      progressWritten: 0,
      fiber: undefined,
      controller: undefined,
      begun: false,
      closedElsewhere: false,
      deadlineExceeded: false,
      deadline: undefined,
      startedAt: undefined,
      callbackWake: undefined,
      key: keyOf(job.jobId, job.runLease),
      // heartbeated from here on, whatever the event loop does next
      held: options.heartbeats.track(job.jobId, job.runLease, heldAt)
    }
    metrics.claimed(job)
    if (job.deadlineAt !== null)
      entry.deadline = deadlines.add(
        heldAt,
        job.deadlineAt.getTime() - job.claimedAt.getTime(),
        expire(entry)
      )
    running.set(entry.key, entry)
    return entry
  }

  const retryBecause =
    (handler: Handler<R> | undefined, entry: RunningAttempt) => (cause: Cause.Cause<unknown>) =>
      Effect.map(
        backoffMs(handler, entry.job.attempt),
        (delayMs): Outcome => ({
          _tag: "Retry",
          delayMs,
          error: `invalid handler outcome: ${Cause.pretty(cause).split("\n")[0]}`
        })
      )

  const logFinalizationFailure = (cause: Cause.Cause<unknown>) =>
    Effect.logWarning("finalization failed; the attempt stays rescuable", cause)

  /**
   * Told of the attempt's outcome once its batch's call has returned, on the batcher's flushing
   * fiber: no fiber of the attempt waits for the acknowledgement (ADR 0031). The attempt leaves
   * the running registry (heartbeats) only then. A failed call is logged by the batcher.
   */
  const finalizedOf =
    (entry: RunningAttempt, runMs: number | undefined): OnFinalized =>
    (result) => {
      forget(entry)
      if (result?._tag !== "Applied") return
      options.onApplied?.(entry.job)
      metrics.finished(entry.job, result.state, runMs)
    }

  /**
   * Hands the outcome to the batcher, unless the attempt was closed elsewhere meanwhile. Called
   * when the submission is due (after `release`, see `releaseThenSubmit`): it reads the flags and
   * the clock then.
   */
  const submitOutcome = (entry: RunningAttempt, outcome: Outcome): Effect.Effect<void> => {
    if (entry.closedElsewhere) {
      forget(entry)
      return Effect.void
    }
    const runMs = entry.startedAt === undefined ? undefined : performance.now() - entry.startedAt
    const onFinalized = finalizedOf(entry, runMs)
    // the attempt's progress goes with its outcome, in the same statement (capability 14);
    // queued at once when there is room (the usual case), else through the waiting path
    if (options.batcher.offer(entry.job, outcome, entry.progress, onFinalized)) return Effect.void
    return Effect.catchCause(
      options.batcher.submitThen(entry.job, outcome, entry.progress, onFinalized),
      (cause) => {
        forget(entry)
        return logFinalizationFailure(cause)
      }
    )
  }

  /** Capacity first (the batcher may make a submitter wait for room), then the outcome. */
  const releaseThenSubmit = (
    entry: RunningAttempt,
    outcome: Outcome,
    release: Effect.Effect<void, never, R>
  ): Effect.Effect<void, never, R> => Effect.flatMap(release, () => submitOutcome(entry, outcome))

  /** Records the outcome of a finished (or interrupted) attempt; runs uninterruptibly. */
  const settle = (
    entry: RunningAttempt,
    handler: Handler<R> | undefined,
    exit: Exit.Exit<Job.JobResult | void, unknown>,
    release: Effect.Effect<void, never, R>
  ): Effect.Effect<void, never, R> => {
    // The body has ended: nothing interrupts it any more (interruptIfBegun does nothing without a
    // fiber), and the entry lives on until its completion is acknowledged. Kept, the fiber (its
    // context, its stack) outlived young-generation collections with it: a third of the bytes a
    // drain promoted to the old generation (docs/benchmarks.md, "A finished attempt's fiber").
    entry.fiber = undefined
    if (entry.deadline !== undefined) {
      deadlines.remove(entry.deadline)
      entry.deadline = undefined
    }
    // cancel, rescue, deadline or shutdown: tell a handler that watches its signal
    if (entry.controller !== undefined && Exit.isFailure(exit) && Cause.hasInterrupts(exit.cause))
      entry.controller.abort()
    if (Exit.isSuccess(exit) && exit.value?._tag === "WaitForCallback" && options.callbacks !== undefined)
      return park(entry, options.callbacks, exit.value.callbackId, release)
    // The common case, a completion, needs no mapping (nothing in it can throw); anything else,
    // even `null`, takes the careful path.
    if (Exit.isSuccess(exit) && (exit.value === undefined || exit.value?._tag === "Completed"))
      return Effect.onError(releaseThenSubmit(entry, complete, release), forgetOnError(entry))
    // Whatever the handler returned (even `null`), the attempt must reach `release` and an
    // outcome: an unexpected failure of the mapping itself becomes a retry with its reason.
    // suspended, so that even a throw while mapping becomes a cause handled below
    return Effect.suspend(() => outcomeOf(handler, entry, exit)).pipe(
      Effect.catchCause(retryBecause(handler, entry)),
      Effect.flatMap((outcome) => releaseThenSubmit(entry, outcome, release)),
      Effect.onError(forgetOnError(entry))
    )
  }

  /** Only a defect of `release` gets here: the attempt is forgotten all the same. */
  const forgetOnError = (entry: RunningAttempt) => () => Effect.sync(() => forget(entry))

  /**
   * Parks the attempt (`JobResult.waitForCallback`): the permit is freed and this process forgets
   * it (no heartbeats: storage does not expect them from a parked attempt). Stale (closed
   * meanwhile, e.g. completed by its callback) needs nothing more. A failed park leaves the
   * attempt open and unparked: no longer heartbeated, the stale sweep retries it.
   */
  const park = (
    entry: RunningAttempt,
    callbacks: CallbackStorage["Service"],
    callbackId: string,
    release: Effect.Effect<void, never, R>
  ): Effect.Effect<void, never, R> =>
    callbacks.park(entry.job, callbackId).pipe(
      Effect.flatMap((parked) =>
        parked._tag === "Stale" && !entry.closedElsewhere
          ? Effect.logDebug(`attempt ${entry.key} closed before it parked`)
          : Effect.void
      ),
      Effect.catchCause((cause) => Effect.logWarning("parking failed; the attempt stays rescuable", cause)),
      Effect.ensuring(release),
      Effect.ensuring(Effect.sync(() => forget(entry)))
    )

  /**
   * Starts a held attempt on its own fiber in `fibers` and runs it to its durable outcome.
   * `release` frees the worker's capacity; it is called exactly once, before the outcome is
   * acknowledged. The fiber is the one `interrupt` (cancel, rescue), the deadline and shutdown
   * interrupt: its exit handler maps the interruption to a retry, or to nothing when closed
   * elsewhere. An attempt closed elsewhere before it started is dropped, and `release` is still
   * called; one whose deadline passed while it waited is recorded as a retry without running.
   */
  const start = (
    fibers: FiberSet.FiberSet<unknown, unknown>,
    entry: RunningAttempt,
    release: Effect.Effect<void, never, R>,
    immediately = false
  ): Effect.Effect<void, never, R> =>
    Effect.suspend(() => {
      if (entry.closedElsewhere) {
        forget(entry)
        return release
      }
      const handler = options.handlers.get(entry.job.kind)
      // Decided when the fiber begins: a cancel or deadline may land between fork and begin.
      const body = Effect.withFiber((fiber): Effect.Effect<Job.JobResult | void, unknown, R> => {
        // the attempt's own fiber, set before anyone can see `begun` (interruptIfBegun)
        entry.fiber = fiber
        entry.begun = true
        entry.startedAt = performance.now()
        if (entry.closedElsewhere) return Effect.interrupt
        if (entry.deadlineExceeded) return Effect.fail(new DeadlineExceeded())
        if (handler !== undefined) {
          if (!options.tracing) return attempt(handler, entry)
          // the tracer this fiber's spans go to: the default one exports nothing
          const exported = fiber.getRef(Tracer.Tracer) !== Tracer.nativeTracer
          // under it, a span only continues a producer's trace (ADR 0043)
          return exported || entry.job.metadata[Traceparent.metadataKey] !== undefined
            ? traced(entry.job, attempt(handler, entry), exported)
            : attempt(handler, entry)
        }
        return options.onUnknownKind === "fail"
          ? Effect.fail(new Job.JobTerminalError({ message: `unknown job kind: ${entry.job.kind}` }))
          : Effect.fail(new Error(`unknown job kind: ${entry.job.kind}`))
      })
      return Effect.asVoid(
        FiberSet.run(
          fibers,
          Effect.onExit(body, (exit) => settle(entry, handler, exit, release)),
          // Only the dispatcher starts immediately (one less scheduler hop before the handler):
          // from a release, the next attempt would run nested in the finishing one's stack.
          { startImmediately: immediately }
        )
      )
    })

  /** Parks a resumed attempt taken back but never started again as resumed (migration 0035). */
  const releaseResumed = (entry: RunningAttempt) =>
    options.callbacks === undefined
      ? Effect.succeed(false)
      : options.callbacks.releaseResumed({ jobId: entry.job.jobId, runLease: entry.job.runLease })

  /**
   * Gives back held attempts that never started (shutdown): snoozed with no delay, so they run
   * again soon, behind the jobs of their lane that are still queued, with the same attempt number.
   * A resumed attempt (taken back by `claimResumed`) is parked again as resumed instead: a snooze
   * would close the attempt and drop its resume payload with it.
   */
  const giveBack = (entries: ReadonlyArray<RunningAttempt>) =>
    Effect.forEach(
      entries,
      (entry) =>
        ("callbackResult" in entry.job ? releaseResumed(entry) : Effect.succeed(false)).pipe(
          Effect.flatMap((released) =>
            released ? Effect.void : options.batcher.submit(entry.job, { _tag: "Snooze", delayMs: 0 })
          ),
          Effect.catchCause((cause) =>
            Effect.logWarning("giving back an unstarted attempt failed; it stays rescuable", cause)
          ),
          Effect.ensuring(Effect.sync(() => forget(entry)))
        ),
      { concurrency: "unbounded", discard: true }
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
      const entry = running.get(keyOf(jobId, runLease))
      if (entry === undefined) return Effect.void
      entry.closedElsewhere = true
      return interruptIfBegun(entry)
    })

  /** A resume notification for this attempt: wakes its in-handler wait, if any. */
  const wakeCallback = (jobId: bigint, runLease: bigint) =>
    Effect.suspend(() => {
      const wake = running.get(keyOf(jobId, runLease))?.callbackWake
      return wake === undefined ? Effect.void : Effect.asVoid(Deferred.succeed(wake, undefined))
    })

  return {
    hold,
    start,
    giveBack,
    interrupt,
    wakeCallback,
    /** Enforces hard deadlines; fork it for the worker's lifetime. */
    deadlines: deadlines.run,
    running: running as ReadonlyMap<string, RunningAttempt>
  }
})

export type Executor<R> = Effect.Success<ReturnType<typeof make<R>>>
