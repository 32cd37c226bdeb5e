/**
 * The producer and operator API (capabilities 1, 3, 4, 19's job actions).
 *
 * **Guarantee** `insert` runs on whatever connection the calling fiber holds, so inside
 * `sql.withTransaction` the job commits or rolls back with the application's own writes.
 * Args are encoded with the job's Schema before anything is written; an encoding failure is a
 * `ValidationError` on `args`. The producer's span context is stored as `awa:traceparent`, unless
 * the caller's metadata carries its own (it wins; a malformed one is a `ValidationError`).
 */
import {
  type BackpressureRejected,
  checkNewJob,
  Job,
  type ReadCommittedRequired,
  Traceparent,
  UniqueKey,
  ValidationError
} from "@awa/core"
import type { EnqueuedJob, EnqueueError, JobView, ListFilter, QueueStateCount } from "@awa/storage"
import { FlowStorage, QueueStorage } from "@awa/storage"
import { Clock, Context, Duration, Effect, Layer, type Option, Schema, Tracer } from "effect"
import type { SqlError } from "effect/sql"
import * as Backpressure from "./Backpressure.ts"
import * as FlowMetrics from "./FlowMetrics.ts"
import * as QueueOverrides from "./QueueOverrides.ts"
import * as RuntimeMetrics from "./RuntimeMetrics.ts"

/** An enqueued job; with `backpressure: "signal"`, also its queue's depth when it was sent. */
export interface InsertResult extends EnqueuedJob {
  readonly pressure?: Backpressure.Pressure | undefined
}

export type InsertError = EnqueueError | BackpressureRejected

export interface AwaClientOptions {
  /**
   * A producer span per insert call, its traceparent stored in job metadata, when a tracer is
   * installed. Under Effect's default tracer (none installed) no span is opened and only a
   * caller's own current span is stored. Off: no span at all and nothing stored. Default true.
   */
  readonly tracing?: boolean | undefined
}

export class AwaClient extends Context.Service<
  AwaClient,
  {
    readonly insert: <A, I>(
      job: Job.JobDefinition<A, I>,
      args: A,
      options?: Job.InsertOptions
    ) => Effect.Effect<InsertResult, InsertError>
    readonly insertMany: <A, I>(
      job: Job.JobDefinition<A, I>,
      args: ReadonlyArray<A>,
      options?: Job.InsertOptions
    ) => Effect.Effect<ReadonlyArray<InsertResult>, InsertError>
    /**
     * Cancels the live job holding the unique key that `insert(job, args, options)` would compute
     * (the definition's `unique` options, or `options.unique`); returns its id, if any.
     */
    readonly cancelByUniqueKey: <A, I>(
      job: Job.JobDefinition<A, I>,
      args: A,
      options?: Job.InsertOptions & { readonly reason?: string | undefined }
    ) => Effect.Effect<Option.Option<bigint>, ValidationError | ReadCommittedRequired | SqlError.SqlError>
    /**
     * Replaces the queue's hot overrides (capabilities.md §13): every worker of the fleet applies
     * them within its `overrideRefreshInterval`. Out-of-range values ⇒ `ValidationError`, nothing written.
     */
    readonly setQueueOverrides: (
      queue: string,
      overrides: QueueOverrides.QueueOverridesInput
    ) => Effect.Effect<QueueOverrides.QueueOverrides, ValidationError | SqlError.SqlError>
    /** Removes the queue's overrides (workers revert to their code's values); true when it had some. */
    readonly clearQueueOverrides: (
      queue: string
    ) => Effect.Effect<boolean, ValidationError | SqlError.SqlError>
    /** Stored overrides of one queue (every queue with some when unset). */
    readonly getQueueOverrides: (
      queue?: string
    ) => Effect.Effect<ReadonlyArray<QueueOverrides.QueueOverridesView>, SqlError.SqlError>
    /**
     * Spreads each priority of the queue over `shards` lanes from the next insert on (capabilities.md
     * §22, `QueueSettings.enqueueShards`): concurrent producers and claimers of one hot queue stop
     * waiting for each other's lane; FIFO holds per shard, and per `orderingKey`. Integer 1–64
     * (1, the default: one lane, strict FIFO per priority); else `ValidationError`, nothing written.
     */
    readonly setEnqueueShards: (
      queue: string,
      shards: number
    ) => Effect.Effect<void, ValidationError | SqlError.SqlError>
    readonly storage: QueueStorage["Service"]
  }
>()("@awa/runtime/AwaClient") {}

export const make = Effect.fnUntraced(function* (options: AwaClientOptions = {}) {
  const storage = yield* QueueStorage
  const tracing = options.tracing ?? true
  const metrics = yield* RuntimeMetrics.makeRecorder
  const flow = yield* FlowStorage.FlowStorage
  const backpressure = Backpressure.make(flow, yield* FlowMetrics.makeRecorder)
  const withFlow = <A, E>(effect: Effect.Effect<A, E, FlowStorage.FlowStorage>) =>
    Effect.provideService(effect, FlowStorage.FlowStorage, flow)

  interface Prepared {
    readonly merged: Job.InsertOptions
    readonly runAt: Date | undefined
    readonly metadata: Job.InsertOptions["metadata"]
  }

  const prepare = <A, I>(
    job: Job.JobDefinition<A, I>,
    options: Job.InsertOptions | undefined
  ): Effect.Effect<Prepared, ValidationError> => {
    const merged = options === undefined ? job.defaults : { ...job.defaults, ...options }
    const needsClock = merged.runAt === undefined && merged.delay !== undefined
    // a caller's own `awa:traceparent` wins over the current span (checked by checkNewJob)
    const stamps = tracing && merged.metadata?.[Traceparent.metadataKey] === undefined
    // the common case needs neither the clock nor the current span: no fiber read per insert
    if (!needsClock && !stamps)
      return Effect.succeed({ merged, runAt: merged.runAt, metadata: merged.metadata })
    return Effect.withFiber((fiber) => {
      let metadata = merged.metadata
      if (stamps) {
        // the current span, as `Effect.currentSpan` finds it: the insert's own producer span
        // under an installed tracer, else the caller's span if it has one (ADR 0043)
        const span = Context.getOrUndefined(fiber.context, Tracer.ParentSpan)
        if (span?._tag === "Span") {
          const traceparent = Traceparent.encode({
            traceId: span.traceId,
            spanId: span.spanId,
            sampled: span.sampled
          })
          metadata = { ...metadata, [Traceparent.metadataKey]: traceparent }
        }
      }
      if (!needsClock) return Effect.succeed({ merged, runAt: merged.runAt, metadata })
      const delay = Duration.fromInput(merged.delay!)
      if (delay._tag === "None")
        return Effect.fail(new ValidationError({ field: "delay", reason: "is not a duration" }))
      return Effect.map(Clock.currentTimeMillis, (now) => ({
        merged,
        runAt: new Date(now + Duration.toMillis(delay.value)),
        metadata
      }))
    })
  }

  // Args are encoded with the Schema's JSON codec, which the worker decodes with (core `argsCodec`).
  const encode = <A, I>(job: Job.JobDefinition<A, I>, args: A) =>
    Schema.encodeEffect(Job.argsCodec(job.args))(args).pipe(
      Effect.mapError((e) => new ValidationError({ field: "args", reason: e.message }))
    )

  // A batch is encoded by one Schema run over the array (one Effect, not one per job).
  const arrayCodecs = new WeakMap<Schema.Top, Schema.Top>()
  const encodeAll = <A, I>(job: Job.JobDefinition<A, I>, args: ReadonlyArray<A>) => {
    let codec = arrayCodecs.get(job.args) as
      | Schema.Codec<ReadonlyArray<A>, ReadonlyArray<unknown>>
      | undefined
    if (codec === undefined) {
      codec = Schema.Array(Job.argsCodec(job.args))
      arrayCodecs.set(job.args, codec)
    }
    return Schema.encodeEffect(codec)(args).pipe(
      Effect.mapError((e) => new ValidationError({ field: "args", reason: e.message }))
    )
  }

  // Each job's concurrency and ordering key: the insert's own, else the definition's function of
  // its args (its answer, `undefined` included, is the key), else the definition's default. The
  // function is user code: a throw is bad input, not a defect. An insert without a key function
  // pays nothing for it.
  const keysFrom = <A>(
    field: "concurrencyKey" | "orderingKey",
    keyOf: ((args: A) => string | undefined) | undefined,
    args: ReadonlyArray<A>
  ): Effect.Effect<ReadonlyArray<string | undefined> | undefined, ValidationError> =>
    keyOf === undefined
      ? Effect.succeed(undefined)
      : Effect.try({
          try: () => args.map(keyOf),
          catch: (e) =>
            new ValidationError({
              field,
              reason: `the definition's ${field} function threw: ${e instanceof Error ? e.message : String(e)}`
            })
        })

  const send = <A, I>(
    job: Job.JobDefinition<A, I>,
    args: ReadonlyArray<A>,
    options?: Job.InsertOptions
  ): Effect.Effect<ReadonlyArray<InsertResult>, InsertError> =>
    Effect.flatMap(prepare(job, options), ({ merged, runAt, metadata }) => {
      const keyOf = options?.concurrencyKey === undefined ? job.concurrencyKey : undefined
      const orderOf = options?.orderingKey === undefined ? job.orderingKey : undefined
      const enqueue = (
        encoded: ReadonlyArray<unknown>,
        keys: ReadonlyArray<string | undefined> | undefined,
        orders: ReadonlyArray<string | undefined> | undefined
      ) =>
        // one metadata and one tags object for the whole batch: storage checks them once
        storage.enqueueMany(
          encoded.map((e, i) => ({
            kind: job.kind,
            queue: merged.queue,
            priority: merged.priority,
            maxAttempts: merged.maxAttempts,
            args: e,
            metadata,
            tags: merged.tags,
            runAt,
            unique: merged.unique,
            concurrencyKey: keys === undefined ? merged.concurrencyKey : keys[i],
            orderingKey: orders === undefined ? merged.orderingKey : orders[i]
          }))
        )
      const written = Effect.flatMap(
        args.length === 1 ? Effect.map(encode(job, args[0]!), (e) => [e]) : encodeAll(job, args),
        (encoded: ReadonlyArray<unknown>) =>
          keyOf === undefined && orderOf === undefined
            ? enqueue(encoded, undefined, undefined)
            : Effect.flatMap(
                Effect.zip(keysFrom("concurrencyKey", keyOf, args), keysFrom("orderingKey", orderOf, args)),
                ([keys, orders]) => enqueue(encoded, keys, orders)
              )
        // counted when the call returned: the caller's transaction may still roll it back
      ).pipe(
        Effect.map((jobs) => {
          if (jobs.length > 0) metrics.enqueued(jobs[0]!.queue, job.kind, jobs.length)
          return jobs
        })
      )
      // "off" (the default) adds nothing, not even a generator; otherwise the check runs first
      const mode = merged.backpressure
      if (mode === undefined || mode === "off") return written
      return Effect.flatMap(backpressure.check(merged.queue ?? "default", mode), (pressure) =>
        pressure === undefined
          ? written
          : Effect.map(written, (jobs) => jobs.map((j) => ({ ...j, pressure })))
      )
    })

  const insertMany = <A, I>(
    job: Job.JobDefinition<A, I>,
    args: ReadonlyArray<A>,
    options?: Job.InsertOptions
  ): Effect.Effect<ReadonlyArray<InsertResult>, InsertError> =>
    // With tracing off there is no producer span at all (as for the worker's consumer spans): a
    // span per insert is measurable per-job cost. Its stack trace would only point here.
    tracing
      ? Effect.withFiber((fiber) =>
          // Under Effect's default tracer nothing exports a span, so the insert opens none of its
          // own and stores no traceparent it would have made up: its trace id would name a trace
          // no backend has (ADR 0043). A caller's own span is still stored (`prepare`).
          fiber.getRef(Tracer.Tracer) === Tracer.nativeTracer
            ? send(job, args, options)
            : send(job, args, options).pipe(
                Effect.withSpan(
                  `send ${job.kind}`,
                  {
                    kind: "producer",
                    attributes: {
                      "messaging.system": "awa",
                      "messaging.operation.type": "send",
                      "awa.job.kind": job.kind
                    }
                  },
                  { captureStackTrace: false }
                )
              )
        )
      : send(job, args, options)

  const cancelByUniqueKey = <A, I>(
    job: Job.JobDefinition<A, I>,
    args: A,
    options?: Job.InsertOptions & { readonly reason?: string | undefined }
  ) =>
    Effect.gen(function* () {
      const { merged, runAt } = yield* prepare(job, options)
      if (merged.unique === undefined) {
        return yield* new ValidationError({ field: "unique", reason: `job ${job.kind} is not unique` })
      }
      const encoded = yield* encode(job, args)
      const checked = yield* checkNewJob(
        { kind: job.kind, queue: merged.queue, args: encoded, runAt, unique: merged.unique },
        { nowMillis: yield* Clock.currentTimeMillis }
      )
      return yield* storage.cancelByUniqueKey(
        UniqueKey.toHex(checked.uniqueKey!),
        options?.reason ?? "cancelled by unique key"
      )
    })

  return AwaClient.of({
    insert: (job, args, options) => Effect.map(insertMany(job, [args], options), (jobs) => jobs[0]!),
    insertMany,
    cancelByUniqueKey,
    setQueueOverrides: (queue, overrides) => withFlow(QueueOverrides.set(queue, overrides)),
    clearQueueOverrides: (queue) => withFlow(QueueOverrides.clear(queue)),
    getQueueOverrides: (queue) => withFlow(QueueOverrides.get(queue === undefined ? undefined : [queue])),
    setEnqueueShards: (queue, shards) => storage.configureQueue(queue, { enqueueShards: shards }),
    storage
  })
})

export const layer = (
  options: AwaClientOptions = {}
): Layer.Layer<AwaClient, never, QueueStorage | FlowStorage.FlowStorage> =>
  Layer.effect(AwaClient, make(options))

/** Reads and operator actions, straight from storage. */
export type { JobView, ListFilter, QueueStateCount }
