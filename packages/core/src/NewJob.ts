/**
 * A job to enqueue, and the checks every insert path runs before any SQL (capabilities.md §1).
 * Both storage layers call `checkNewJob`, so the Postgres and simulation layers reject exactly the
 * same input with the same `ValidationError`.
 */
import { Effect } from "effect"
import { ValidationError } from "./AwaError.ts"
import { canonicalJson, JsonError } from "./CanonicalJson.ts"
import { defaultUniqueStates, type JobState, jobStates, stateMask } from "./JobState.ts"
import { decode as decodeTraceparent, metadataKey } from "./Traceparent.ts"
import { periodBucket, toHex, uniqueKey } from "./UniqueKey.ts"

export const limits = {
  nameMaxLength: 200,
  minPriority: 1,
  maxPriority: 4,
  defaultPriority: 2,
  minMaxAttempts: 1,
  maxMaxAttempts: 1000,
  defaultMaxAttempts: 25,
  maxTags: 20,
  tagMaxLength: 100,
  /** Default `maxArgsBytes`: encoded args larger than this are rejected. */
  defaultMaxArgsBytes: 1024 * 1024,
  /** Longest `concurrencyKey`, in UTF-8 bytes (capabilities.md §23, chosen). */
  concurrencyKeyMaxBytes: 1024,
  /** Longest `orderingKey`, in UTF-8 bytes (capabilities.md §22, chosen). */
  orderingKeyMaxBytes: 1024
} as const

/**
 * Metadata entry carrying a job's concurrency key (capabilities.md §23): set from
 * `NewJob.concurrencyKey` (users cannot write `awa:` keys themselves); SQL producers write it in
 * the metadata object. The claim of a queue bound to a key policy digests it (`key_digest`).
 */
export const concurrencyKeyMetadata = "awa:concurrencyKey"

/**
 * Metadata entry carrying a job's ordering key (capabilities.md §22): set from
 * `NewJob.orderingKey`. In a queue with `enqueueShards` > 1 the insert digests it to choose the
 * job's shard, so jobs with one ordering key share a lane and run in insert order among themselves.
 */
export const orderingKeyMetadata = "awa:orderingKey"

export interface UniqueOptions {
  /** Include the queue in the key. Default false. */
  readonly byQueue?: boolean | undefined
  /** Include the canonical JSON of the args. Default true. */
  readonly byArgs?: boolean | undefined
  /** Include the period bucket `floor(runAt or now / period)`, in milliseconds (1 s – 366 days). */
  readonly byPeriodMs?: number | undefined
  /** States in which the key is held. Default: scheduled, available, running, waiting_external, retryable, completed. */
  readonly states?: ReadonlyArray<JobState> | undefined
}

export interface NewJob {
  readonly kind: string
  /** Default `"default"`. 1–200 characters, no NUL, no leading or trailing whitespace. */
  readonly queue?: string | undefined
  /** 1 (highest) – 4. Default 2. */
  readonly priority?: number | undefined
  /** Already Schema-encoded args: any JSON value. */
  readonly args: unknown
  readonly metadata?: Readonly<Record<string, unknown>> | undefined
  readonly tags?: ReadonlyArray<string> | undefined
  /** 1–1000. Default 25. */
  readonly maxAttempts?: number | undefined
  /** None or at/before the database's now ⇒ available; later ⇒ scheduled. */
  readonly runAt?: Date | undefined
  readonly unique?: UniqueOptions | undefined
  /**
   * Per-key execution control (capabilities.md §23): in a queue bound to a key policy, at most
   * the policy's `maxInFlight` jobs with the same key run at once across the fleet. 1–1,024 UTF-8
   * bytes, no NUL. Ignored by queues without a key policy (the key is still stored).
   */
  readonly concurrencyKey?: string | undefined
  /**
   * Sharded queues (capabilities.md §22): jobs with the same ordering key go to the same shard of
   * a queue whose `enqueueShards` is above 1, so they keep insert order among themselves (without
   * one, a job with a `concurrencyKey` follows that key). 1–1,024 UTF-8 bytes, no NUL. Stored
   * with the job; no effect on a queue of one shard.
   */
  readonly orderingKey?: string | undefined
}

/** A job that passed every check, with its JSON already rendered. */
export interface CheckedJob {
  readonly kind: string
  readonly queue: string
  readonly priority: number
  readonly args: unknown
  readonly argsJson: string
  readonly metadataJson: string
  readonly tags: ReadonlyArray<string>
  readonly maxAttempts: number
  readonly runAt: Date | undefined
  readonly uniqueKey: Uint8Array | undefined
  readonly uniqueStates: number
}

export interface CheckOptions {
  readonly maxArgsBytes?: number | undefined
  /** Producer clock in epoch milliseconds, for `byPeriodMs` buckets without a `runAt`. */
  readonly nowMillis: number
}

/**
 * What the checks of one batch learnt about objects its jobs share (an `insertMany` gives every
 * job the same metadata, tags and unique options): each shared object is checked and rendered
 * once per batch, by identity. Create one per batch; the batch is checked synchronously, so
 * nothing can change those objects between two of its jobs.
 */
export class CheckMemo {
  metadata: unknown = undefined
  metadataJson = ""
  tags: unknown = undefined
  tagsCopy: ReadonlyArray<string> = []
  unique: UniqueOptions | undefined = undefined
  uniqueStates = 0
}

const fail = (field: string, reason: string) => new ValidationError({ field, reason })

/** A name by the documented rules (`trimmed`: no leading or trailing whitespace), or why not. */
export const checkName = (field: string, value: unknown, trimmed = true): ValidationError | undefined => {
  if (typeof value !== "string") return fail(field, "must be a string")
  if (value.length < 1 || value.length > limits.nameMaxLength) {
    return fail(field, `must be 1–${limits.nameMaxLength} characters (got ${value.length})`)
  }
  if (value.includes("\u0000")) return fail(field, "must not contain NUL")
  if (trimmed && value.trim() !== value) return fail(field, "must not start or end with whitespace")
  return undefined
}

/** Checks a queue name by the documented rules. */
export const checkQueueName = (queue: unknown): Effect.Effect<string, ValidationError> => {
  const error = checkName("queue", queue, true)
  return error ? Effect.fail(error) : Effect.succeed(queue as string)
}

const checkInt = (field: string, value: number, min: number, max: number) =>
  Number.isInteger(value) && value >= min && value <= max
    ? undefined
    : fail(field, `must be an integer ${min}–${max} (got ${value})`)

const json = (value: unknown, field: string): string | ValidationError => {
  try {
    return canonicalJson(value, field)
  } catch (error) {
    if (error instanceof JsonError) return fail(error.path, error.message.slice(error.path.length + 2))
    throw error
  }
}

const emptyMetadata: Readonly<Record<string, unknown>> = {}
const noTags: ReadonlyArray<string> = []

/**
 * `checkNewJob` without the Effect: the checked job, or the `ValidationError` (returned, not
 * thrown). For batches, which check thousands of jobs in one loop; pass one `CheckMemo` for the
 * whole batch.
 */
export const checkNewJobSync = (
  job: NewJob,
  options: CheckOptions,
  memo?: CheckMemo
): CheckedJob | ValidationError => {
  const kindError = checkName("kind", job.kind, false)
  if (kindError) return kindError
  const queue = job.queue ?? "default"
  const queueError = checkName("queue", queue, true)
  if (queueError) return queueError
  const priority = job.priority ?? limits.defaultPriority
  const maxAttempts = job.maxAttempts ?? limits.defaultMaxAttempts
  const rangeError =
    checkInt("priority", priority, limits.minPriority, limits.maxPriority) ??
    checkInt("maxAttempts", maxAttempts, limits.minMaxAttempts, limits.maxMaxAttempts)
  if (rangeError) return rangeError
  if (job.runAt !== undefined && (!(job.runAt instanceof Date) || Number.isNaN(job.runAt.getTime()))) {
    return fail("runAt", "must be a valid Date")
  }
  const argsJson = json(job.args, "args")
  if (argsJson instanceof ValidationError) return argsJson
  const maxArgsBytes = options.maxArgsBytes ?? limits.defaultMaxArgsBytes
  const argsBytes = Buffer.byteLength(argsJson)
  if (argsBytes > maxArgsBytes)
    return fail("args", `encoded args are ${argsBytes} bytes, over the ${maxArgsBytes}-byte limit`)
  const metadata = job.metadata ?? emptyMetadata
  let metadataJson: string
  if (memo !== undefined && metadata === memo.metadata) metadataJson = memo.metadataJson
  else {
    if (typeof metadata !== "object" || metadata === null || Array.isArray(metadata)) {
      return fail("metadata", "must be a JSON object")
    }
    for (const key of Object.keys(metadata)) {
      if (key.startsWith("awa:") && key !== metadataKey)
        return fail(`metadata.${key}`, 'the "awa:" prefix is reserved')
    }
    // A caller-supplied trace context is kept as given (it wins over the current span), so it
    // must be one: a malformed value would silently break the job's trace.
    if (Object.hasOwn(metadata, metadataKey) && decodeTraceparent(metadata[metadataKey]) === undefined) {
      return fail(
        `metadata.${metadataKey}`,
        "must be a W3C traceparent: 00-<32 hex trace id>-<16 hex span id>-<2 hex flags>, ids not all zero"
      )
    }
    const rendered = json(metadata, "metadata")
    if (rendered instanceof ValidationError) return rendered
    metadataJson = rendered
    if (memo !== undefined) {
      memo.metadata = metadata
      memo.metadataJson = metadataJson
    }
  }
  if (job.concurrencyKey !== undefined) {
    const keyed = withConcurrencyKey(job, metadataJson)
    if (keyed instanceof ValidationError) return keyed
    metadataJson = keyed
  }
  if (job.orderingKey !== undefined) {
    const ordered = withOrderingKey(job.orderingKey, metadataJson)
    if (ordered instanceof ValidationError) return ordered
    metadataJson = ordered
  }
  const tags = job.tags ?? noTags
  let tagsCopy: ReadonlyArray<string>
  if (memo !== undefined && tags === memo.tags) tagsCopy = memo.tagsCopy
  else {
    if (!Array.isArray(tags) || tags.length > limits.maxTags)
      return fail("tags", `at most ${limits.maxTags} tags`)
    for (const [i, tag] of tags.entries()) {
      if (
        typeof tag !== "string" ||
        tag.length < 1 ||
        tag.length > limits.tagMaxLength ||
        tag.includes("\u0000")
      ) {
        return fail(`tags[${i}]`, `each tag must be 1–${limits.tagMaxLength} characters without NUL`)
      }
    }
    tagsCopy = [...tags]
    if (memo !== undefined) {
      memo.tags = tags
      memo.tagsCopy = tagsCopy
    }
  }
  let key: Uint8Array | undefined
  let uniqueStates = 0
  if (job.unique !== undefined) {
    const u = job.unique
    if (memo !== undefined && u === memo.unique) uniqueStates = memo.uniqueStates
    else {
      if (
        u.byPeriodMs !== undefined &&
        !(Number.isInteger(u.byPeriodMs) && u.byPeriodMs >= 1000 && u.byPeriodMs <= 366 * 86_400_000)
      ) {
        return fail("unique.byPeriodMs", "must be an integer number of milliseconds between 1 s and 366 days")
      }
      const states = u.states ?? defaultUniqueStates
      for (const state of states) {
        if (!jobStates.includes(state)) return fail("unique.states", `unknown state ${String(state)}`)
      }
      if (states.length === 0) return fail("unique.states", "must name at least one state")
      uniqueStates = stateMask(states)
      if (memo !== undefined) {
        memo.unique = u
        memo.uniqueStates = uniqueStates
      }
    }
    key = uniqueKey({
      kind: job.kind,
      queue: u.byQueue ? queue : undefined,
      // argsJson is already canonical: hashed as it is, not parsed and rendered again
      argsJson: u.byArgs === false ? undefined : argsJson,
      periodBucket:
        u.byPeriodMs === undefined
          ? undefined
          : periodBucket(job.runAt?.getTime() ?? options.nowMillis, u.byPeriodMs)
    })
  }
  return {
    kind: job.kind,
    queue,
    priority,
    args: job.args,
    argsJson,
    metadataJson,
    tags: tagsCopy,
    maxAttempts,
    runAt: job.runAt,
    uniqueKey: key,
    uniqueStates
  }
}

/**
 * The metadata JSON with the job's concurrency key added (a keyed job's metadata is rendered per
 * job, so the batch memo, which shares one rendering by identity, is not touched).
 */
const withConcurrencyKey = (job: NewJob, metadataJson: string): string | ValidationError => {
  const key = job.concurrencyKey
  const bad = checkKey("concurrencyKey", key, limits.concurrencyKeyMaxBytes)
  if (bad !== undefined) return bad
  // A unique mask that takes its key at claim ('running' without 'available') is claimed by a
  // path the keyed claim does not take (docs/adr/0029-key-execution-grants.md).
  const states = job.unique === undefined ? undefined : (job.unique.states ?? defaultUniqueStates)
  if (states?.includes("running") && !states.includes("available")) {
    return fail(
      "concurrencyKey",
      "cannot be combined with a unique mask holding 'running' but not 'available'"
    )
  }
  return json({ ...(JSON.parse(metadataJson) as object), [concurrencyKeyMetadata]: key }, "metadata")
}

/** Runs every check of capabilities.md §1 on a job; nothing is written by anyone before this passes. */
export const checkNewJob = (job: NewJob, options: CheckOptions): Effect.Effect<CheckedJob, ValidationError> =>
  Effect.suspend(() => {
    const result = checkNewJobSync(job, options)
    return result instanceof ValidationError ? Effect.fail(result) : Effect.succeed(result)
  })

export const uniqueKeyHex = (job: CheckedJob): string | undefined =>
  job.uniqueKey ? toHex(job.uniqueKey) : undefined

/** The metadata JSON with the job's ordering key added (rendered per job, as the concurrency key). */
const withOrderingKey = (key: unknown, metadataJson: string): string | ValidationError =>
  checkKey("orderingKey", key, limits.orderingKeyMaxBytes) ??
  json({ ...(JSON.parse(metadataJson) as object), [orderingKeyMetadata]: key }, "metadata")

/** A concurrency or ordering key: a string of 1–`maxBytes` UTF-8 bytes without NUL. */
const checkKey = (field: string, key: unknown, maxBytes: number): ValidationError | undefined => {
  if (typeof key !== "string") return fail(field, "must be a string")
  const bytes = Buffer.byteLength(key)
  if (bytes < 1 || bytes > maxBytes) return fail(field, `must be 1–${maxBytes} UTF-8 bytes (got ${bytes})`)
  if (key.includes("\u0000")) return fail(field, "must not contain NUL")
  return undefined
}
