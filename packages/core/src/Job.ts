/**
 * Job definitions, handler results and handler errors (capability 3).
 *
 * A job is declared once with a kind and an `effect/Schema` for its args; the same definition
 * types the producer (`AwaClient.insert`) and the handler. Args are stored in their *encoded*
 * form, so a Schema with transformations round-trips through the database. The encoded form is
 * that of the Schema's JSON codec (`argsCodec`), so any Schema round-trips, including those whose
 * plain encoded form is not JSON (`Schema.Date`, `Schema.BigInt`, `Schema.Option`, maps, classes).
 */
import { type Duration, Schema } from "effect"
import type { UniqueOptions } from "./NewJob.ts"

/** Per-insert options; a job definition's `defaults` use the same shape. */
export interface InsertOptions {
  /** Default: the definition's queue, else `"default"`. */
  readonly queue?: string | undefined
  /** 1 (highest) – 4. Default 2. */
  readonly priority?: number | undefined
  /** 1–1000. Default 25. */
  readonly maxAttempts?: number | undefined
  /** Run at this instant (producer clock). Takes precedence over `delay`. */
  readonly runAt?: Date | undefined
  /** Run after this long (producer clock). */
  readonly delay?: Duration.Input | undefined
  readonly metadata?: Readonly<Record<string, unknown>> | undefined
  /** At most 20, each 1–100 characters. */
  readonly tags?: ReadonlyArray<string> | undefined
  readonly unique?: UniqueOptions | undefined
  /**
   * Per-key execution control (capabilities.md §23): 1–1,024 UTF-8 bytes. Counts against the
   * key policy of the queue, if it has one (`keyPolicy` worker option).
   */
  readonly concurrencyKey?: string | undefined
  /**
   * Sharded queues (capabilities.md §22): in a queue whose `enqueueShards` is above 1, jobs with
   * the same ordering key go to the same shard and run in insert order among themselves. 1–1,024
   * UTF-8 bytes. Without one, a job with a `concurrencyKey` follows that key's shard, and any
   * other insert call takes the next shard in turn.
   */
  readonly orderingKey?: string | undefined
  /**
   * Producer flow control (capabilities.md §25). `"off"` (default): no depth check, no query.
   * `"signal"`: the result carries `pressure: { queue, depth, capped }`, the queue's claimable
   * jobs counted up to 100,000 and cached per process for at most 1 s. `{ reject: { limit } }`
   * (limit 1–1,000,000): when the queue already holds `limit` claimable jobs the insert fails
   * with `BackpressureRejected` before anything is written (a batch is refused whole); the count
   * stops at `limit`, so the check costs at most `limit` index entries, and is cached ≤ 1 s.
   * Inside the caller's transaction a rejection fails that transaction's business work too:
   * queue health becomes a business failure, so choose it deliberately.
   */
  readonly backpressure?: Backpressure | undefined
}

/** See `InsertOptions.backpressure`. */
export type Backpressure = "off" | "signal" | { readonly reject: { readonly limit: number } }

export interface JobDefinition<A, I = A> {
  readonly kind: string
  readonly args: Schema.Codec<A, I>
  readonly defaults: InsertOptions
  /** Custom backoff after `attempt` failed attempts; default `2^attempt` s + jitter, capped at 24 h. */
  readonly backoff: ((attempt: number) => Duration.Input) | undefined
  /**
   * Each job's `concurrencyKey` from its args, for inserts whose options name none (so one
   * `insertMany` can carry a key per job). `undefined`: that job has no key.
   */
  readonly concurrencyKey?: ((args: A) => string | undefined) | undefined
  /** Each job's `orderingKey` from its args, as `concurrencyKey` (capabilities.md §22). */
  readonly orderingKey?: ((args: A) => string | undefined) | undefined
}

export interface DefineOptions<A, I> {
  /** 1–200 characters, no NUL. */
  readonly kind: string
  readonly args: Schema.Codec<A, I>
  readonly queue?: string | undefined
  readonly defaults?: InsertOptions | undefined
  readonly backoff?: ((attempt: number) => Duration.Input) | undefined
  /**
   * Each job's `concurrencyKey` from its args (capabilities.md §23), e.g. `(a) => a.tenantId`:
   * used when an insert's options name no key; `undefined` for a job without one. It must not
   * throw (a throw fails the insert with a `ValidationError`, nothing written).
   */
  readonly concurrencyKey?: ((args: A) => string | undefined) | undefined
  /**
   * Each job's `orderingKey` from its args (capabilities.md §22), e.g. `(a) => a.userId`: in a
   * sharded queue, one key's jobs share a shard and keep insert order. Used when an insert's
   * options name none; `undefined` for a job without one; a throw fails the insert with a
   * `ValidationError`, nothing written.
   */
  readonly orderingKey?: ((args: A) => string | undefined) | undefined
}

const jsonCodecs = new WeakMap<Schema.Top, Schema.Codec<unknown, unknown>>()

/**
 * The codec args are stored with: the Schema's canonical JSON codec (`Schema.toCodecJson`).
 * Insert encodes with it and the worker decodes with it, so what one writes the other reads:
 * a `Date` is stored as its ISO string, a `bigint` as a decimal string, an `Option` as
 * `{ _tag, value }`, a `Map` as an array of entries, an optional key left `undefined` as `null`.
 * For a Schema whose encoded form is already JSON the stored args are what `Schema.encode`
 * gives. Built once per Schema.
 */
export const argsCodec = <A, I>(args: Schema.Codec<A, I>): Schema.Codec<A, unknown> => {
  let codec = jsonCodecs.get(args)
  if (codec === undefined) {
    codec = Schema.toCodecJson(args) as unknown as Schema.Codec<unknown, unknown>
    jsonCodecs.set(args, codec)
  }
  return codec as Schema.Codec<A, unknown>
}

/** Declares a job kind. Checks run where the definition is used (insert, worker layer). */
export const define = <A, I>(options: DefineOptions<A, I>): JobDefinition<A, I> => ({
  kind: options.kind,
  args: options.args,
  defaults: { ...options.defaults, ...(options.queue === undefined ? {} : { queue: options.queue }) },
  backoff: options.backoff,
  ...(options.concurrencyKey === undefined ? {} : { concurrencyKey: options.concurrencyKey }),
  ...(options.orderingKey === undefined ? {} : { orderingKey: options.orderingKey })
})

/**
 * CamelCase → snake_case kind names: `SMTPEmail` → `smtp_email`, `OAuthRefresh` → `o_auth_refresh`,
 * `HTMLToPDF` → `html_to_pdf`, `ProcessV2Import` → `process_v2_import`.
 */
export const deriveKind = (typeName: string): string =>
  typeName
    .replace(/([A-Z]+)([A-Z][a-z])/g, "$1_$2")
    .replace(/([a-z0-9])([A-Z])/g, "$1_$2")
    .toLowerCase()

/** What a handler's attempt came to; a handler returning `void` completed. */
export type JobResult =
  | { readonly _tag: "Completed" }
  /** A failure with a chosen delay: consumes an attempt. */
  | { readonly _tag: "RetryAfter"; readonly delay: Duration.Input; readonly reason: string }
  /** Not a failure: run again after `delay`; the attempt is not counted. */
  | { readonly _tag: "Snooze"; readonly delay: Duration.Input }
  | { readonly _tag: "Cancel"; readonly reason: string }
  /**
   * Park until the callback registered with `ctx.registerCallback` is resolved from outside
   * (capabilities.md §17): the worker's permit is freed, the attempt stays open with its run lease.
   */
  | { readonly _tag: "WaitForCallback"; readonly callbackId: string }

/** A registered callback: send `id` to the external system (after registering, never before). */
export interface CallbackToken {
  readonly id: string
}

export const JobResult = {
  completed: { _tag: "Completed" } as JobResult,
  retryAfter: (delay: Duration.Input, reason = "retry requested"): JobResult => ({
    _tag: "RetryAfter",
    delay,
    reason
  }),
  snooze: (delay: Duration.Input): JobResult => ({ _tag: "Snooze", delay }),
  cancel: (reason: string): JobResult => ({ _tag: "Cancel", reason }),
  waitForCallback: (token: CallbackToken): JobResult => ({ _tag: "WaitForCallback", callbackId: token.id })
} as const

/** Fails the job now, whatever attempts remain. */
export class JobTerminalError extends Schema.TaggedError<JobTerminalError>()("JobTerminalError", {
  message: Schema.String
}) {}

/** A retryable failure with a message (any other error in the handler's error channel is retryable too). */
export class JobRetryableError extends Schema.TaggedError<JobRetryableError>()("JobRetryableError", {
  message: Schema.String,
  cause: Schema.optional(Schema.Unknown)
}) {}
