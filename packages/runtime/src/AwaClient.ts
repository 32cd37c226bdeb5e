/**
 * The producer and operator API (capabilities 1, 3, 4, 19's job actions).
 *
 * **Guarantee** `insert` runs on whatever connection the calling fiber holds, so inside
 * `sql.withTransaction` the job commits or rolls back with the application's own writes.
 * Args are encoded with the job's Schema before anything is written; an encoding failure is a
 * `ValidationError` on `args`. The producer's span context is stored as `awa:traceparent`.
 */
import { type Job, Traceparent, ValidationError } from "@awa/core"
import type { EnqueuedJob, EnqueueError, JobView, ListFilter, QueueStateCount } from "@awa/storage"
import { QueueStorage } from "@awa/storage"
import { Clock, Context, Duration, Effect, Layer, Schema } from "effect"

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

  return AwaClient.of({
    insert: (job, args, options) => Effect.map(insertMany(job, [args], options), (jobs) => jobs[0]!),
    insertMany,
    storage
  })
})

export const layer = (options: AwaClientOptions = {}): Layer.Layer<AwaClient, never, QueueStorage> =>
  Layer.effect(AwaClient, make(options))

/** Reads and operator actions, straight from storage. */
export type { JobView, ListFilter, QueueStateCount }
