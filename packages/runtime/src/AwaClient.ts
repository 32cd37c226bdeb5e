/**
 * The producer and operator API (capabilities 1, 3, 4, 19's job actions).
 *
 * **Guarantee** `insert` runs on whatever connection the calling fiber holds, so inside
 * `sql.withTransaction` the job commits or rolls back with the application's own writes.
 * Args are encoded with the job's Schema before anything is written; an encoding failure is a
 * `ValidationError` on `args`. The producer's span context is stored as `awa:traceparent`.
 */
import { checkNewJob, type Job, Traceparent, UniqueKey, ValidationError } from "@awa/core"
import type { EnqueuedJob, EnqueueError, JobView, ListFilter, QueueStateCount } from "@awa/storage"
import { QueueStorage } from "@awa/storage"
import { Clock, Context, Duration, Effect, Layer, type Option, Schema } from "effect"
import type { SqlError } from "effect/sql"

export interface AwaClientOptions {
  /** Store the producer span's traceparent in job metadata. Default true. */
  readonly tracing?: boolean | undefined
}

export class AwaClient extends Context.Service<
  AwaClient,
  {
    readonly insert: <A, I>(
      job: Job.JobDefinition<A, I>,
      args: A,
      options?: Job.InsertOptions
    ) => Effect.Effect<EnqueuedJob, EnqueueError>
    readonly insertMany: <A, I>(
      job: Job.JobDefinition<A, I>,
      args: ReadonlyArray<A>,
      options?: Job.InsertOptions
    ) => Effect.Effect<ReadonlyArray<EnqueuedJob>, EnqueueError>
    /**
     * Cancels the live job holding the unique key that `insert(job, args, options)` would compute
     * (the definition's `unique` options, or `options.unique`); returns its id, if any.
     */
    readonly cancelByUniqueKey: <A, I>(
      job: Job.JobDefinition<A, I>,
      args: A,
      options?: Job.InsertOptions & { readonly reason?: string | undefined }
    ) => Effect.Effect<Option.Option<bigint>, ValidationError | SqlError.SqlError>
    readonly storage: QueueStorage["Service"]
  }
>()("@awa/runtime/AwaClient") {}

export const make = Effect.fnUntraced(function* (options: AwaClientOptions = {}) {
  const storage = yield* QueueStorage
  const tracing = options.tracing ?? true

  const prepare = <A, I>(job: Job.JobDefinition<A, I>, options: Job.InsertOptions | undefined) =>
    Effect.gen(function* () {
      const merged = { ...job.defaults, ...options }
      let runAt = merged.runAt
      if (runAt === undefined && merged.delay !== undefined) {
        const delay = Duration.fromInput(merged.delay)
        if (delay._tag === "None")
          return yield* new ValidationError({ field: "delay", reason: "is not a duration" })
        runAt = new Date((yield* Clock.currentTimeMillis) + Duration.toMillis(delay.value))
      }
      let metadata = merged.metadata
      if (tracing) {
        const span = yield* Effect.option(Effect.currentSpan)
        if (span._tag === "Some") {
          const traceparent = Traceparent.encode({
            traceId: span.value.traceId,
            spanId: span.value.spanId,
            sampled: span.value.sampled
          })
          metadata = { ...metadata, [Traceparent.metadataKey]: traceparent }
        }
      }
      return { merged, runAt, metadata }
    })

  const encode = <A, I>(job: Job.JobDefinition<A, I>, args: A) =>
    Schema.encodeEffect(job.args)(args).pipe(
      Effect.mapError((e) => new ValidationError({ field: "args", reason: e.message }))
    )

  const insertMany = <A, I>(
    job: Job.JobDefinition<A, I>,
    args: ReadonlyArray<A>,
    options?: Job.InsertOptions
  ) =>
    Effect.gen(function* () {
      const { merged, runAt, metadata } = yield* prepare(job, options)
      const encoded = yield* Effect.forEach(args, (a) => encode(job, a))
      return yield* storage.enqueueMany(
        encoded.map((e) => ({
          kind: job.kind,
          queue: merged.queue,
          priority: merged.priority,
          maxAttempts: merged.maxAttempts,
          args: e,
          metadata,
          tags: merged.tags,
          runAt,
          unique: merged.unique
        }))
      )
    }).pipe(
      Effect.withSpan(`send ${job.kind}`, {
        kind: "producer",
        attributes: {
          "messaging.system": "awa",
          "messaging.operation.type": "send",
          "awa.job.kind": job.kind
        }
      })
    )

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
    storage
  })
})

export const layer = (options: AwaClientOptions = {}): Layer.Layer<AwaClient, never, QueueStorage> =>
  Layer.effect(AwaClient, make(options))

/** Reads and operator actions, straight from storage. */
export type { JobView, ListFilter, QueueStateCount }
