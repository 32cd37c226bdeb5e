/**
 * Errors shared across Awa packages. Every error is a `Schema.TaggedError` whose fields locate the
 * fault, so callers can match on `_tag` and operators can read the message without a stack trace.
 * Errors raised by a single service live in that service's module instead.
 */
import { Schema } from "effect"

/** A per-call option or argument was rejected before anything was written. */
export class ValidationError extends Schema.TaggedError<ValidationError>()("ValidationError", {
  field: Schema.String,
  reason: Schema.String
}) {
  override get message(): string {
    return `invalid ${this.field}: ${this.reason}`
  }
}

/** Runtime configuration was rejected while a layer was being built; `issues` names every field. */
export class AwaConfigError extends Schema.TaggedError<AwaConfigError>()("AwaConfigError", {
  issues: Schema.Array(Schema.Struct({ path: Schema.String, reason: Schema.String }))
}) {
  override get message(): string {
    return `invalid configuration: ${this.issues.map((i) => `${i.path}: ${i.reason}`).join("; ")}`
  }
}

/** The database schema was migrated by newer code than this process knows (ADR-041 fence). */
export class SchemaTooNew extends Schema.TaggedError<SchemaTooNew>()("SchemaTooNew", {
  schema: Schema.String,
  found: Schema.Number,
  known: Schema.Number
}) {
  override get message(): string {
    return `schema "${this.schema}" is at version ${this.found}, newer than this code knows (${this.known}); upgrade the code before starting it`
  }
}

/** The database schema is older than this code needs and migrating on start is off. */
export class SchemaNotMigrated extends Schema.TaggedError<SchemaNotMigrated>()("SchemaNotMigrated", {
  schema: Schema.String,
  found: Schema.Number,
  required: Schema.Number
}) {
  override get message(): string {
    return `schema "${this.schema}" is at version ${this.found} but this code needs ${this.required}; apply the migrations with Awa.migrate() (from @awa/runtime), or start with migrateOnStart: true`
  }
}

/** No job with this id is visible in any state. */
export class JobNotFound extends Schema.TaggedError<JobNotFound>()("JobNotFound", {
  jobId: Schema.BigInt
}) {
  override get message(): string {
    return `job ${this.jobId} not found`
  }
}

/** A unique job's key is already held by a live job (capability 4). */
export class UniqueConflict extends Schema.TaggedError<UniqueConflict>()("UniqueConflict", {
  key: Schema.String,
  existingJobId: Schema.BigInt
}) {
  override get message(): string {
    return `unique key ${this.key} is held by job ${this.existingJobId}`
  }
}

/** An operator action does not apply to the job's current state. */
export class InvalidTransition extends Schema.TaggedError<InvalidTransition>()("InvalidTransition", {
  jobId: Schema.BigInt,
  from: Schema.String,
  action: Schema.String
}) {
  override get message(): string {
    return `cannot ${this.action} job ${this.jobId} in state ${this.from}`
  }
}

/** A bulk action with an empty filter, without `all: true`. */
export class UnsafeBulkFilter extends Schema.TaggedError<UnsafeBulkFilter>()("UnsafeBulkFilter", {
  action: Schema.String
}) {
  override get message(): string {
    return `${this.action} with an empty filter would touch every entry; pass all: true to mean it`
  }
}

/**
 * An insert with `backpressure: { reject: { limit } }` found its queue's depth at the limit
 * (capabilities.md §25); nothing was written. `depth` is the capped count it saw (≥ `limit`).
 */
export class BackpressureRejected extends Schema.TaggedError<BackpressureRejected>()("BackpressureRejected", {
  queue: Schema.String,
  depth: Schema.Number,
  limit: Schema.Number
}) {
  override get message(): string {
    return `queue ${this.queue} holds at least ${this.depth} claimable jobs (limit ${this.limit}); insert refused`
  }
}

/** A handler's progress (percent, message and metadata) would exceed `maxProgressBytes` (capability 14). */
export class ProgressTooLarge extends Schema.TaggedError<ProgressTooLarge>()("ProgressTooLarge", {
  bytes: Schema.Number,
  maxBytes: Schema.Number
}) {
  override get message(): string {
    return `progress of ${this.bytes} bytes exceeds maxProgressBytes (${this.maxBytes}); it was not recorded`
  }
}

/**
 * A storage operation whose guards need READ COMMITTED (claim, finalize, prune, cancel, retry,
 * DLQ and bulk actions, …) was called inside a REPEATABLE READ or SERIALIZABLE transaction
 * (SQLSTATE AWI01, migration 0027). Enqueue is never refused: outside READ COMMITTED it defers
 * the job to the next promotion instead (0018).
 */
export class ReadCommittedRequired extends Schema.TaggedError<ReadCommittedRequired>()(
  "ReadCommittedRequired",
  {
    operation: Schema.String,
    isolation: Schema.String
  }
) {
  override get message(): string {
    return `${this.operation} needs READ COMMITTED; it was called inside a ${this.isolation} transaction`
  }
}

/** No callback has this id (never registered, malformed, or its attempt's records are reclaimed). */
export class CallbackNotFound extends Schema.TaggedError<CallbackNotFound>()("CallbackNotFound", {
  callbackId: Schema.String
}) {
  override get message(): string {
    return `callback ${this.callbackId} not found`
  }
}

/**
 * The callback id is known but no longer current: its attempt finished (or another resolution won),
 * or the handler registered a newer callback since.
 */
export class CallbackStale extends Schema.TaggedError<CallbackStale>()("CallbackStale", {
  callbackId: Schema.String
}) {
  override get message(): string {
    return `callback ${this.callbackId} is stale: already resolved, superseded, or its attempt ended`
  }
}

/** A callback request's signature is missing, malformed or does not match. */
export class InvalidSignature extends Schema.TaggedError<InvalidSignature>()("InvalidSignature", {
  reason: Schema.String
}) {
  override get message(): string {
    return `invalid callback signature: ${this.reason}`
  }
}

/** A CEL expression given to `registerCallback` does not compile. */
export class InvalidCelExpression extends Schema.TaggedError<InvalidCelExpression>()("InvalidCelExpression", {
  field: Schema.String,
  expression: Schema.String,
  reason: Schema.String
}) {
  override get message(): string {
    return `invalid CEL expression in ${this.field} (${JSON.stringify(this.expression)}): ${this.reason}`
  }
}
