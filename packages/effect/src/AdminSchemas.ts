/**
 * The admin HTTP API's bodies as Schemas (issue 18 item 5): what `/openapi.json` documents for
 * each route, in the JSON form the API sends (the CLI's `--json`): bigints (job ids, run leases,
 * generations) as decimal strings, instants as ISO-8601 text. Job arguments, metadata, progress
 * and a cron schedule's job template are the application's own JSON: `Unknown` here.
 *
 * A field missing from a schema would be dropped from the response when it is encoded, so the
 * admin API tests compare whole bodies against the storage's values.
 */
import { Schema } from "effect"

/** ISO-8601 text (an instant). */
const Instant = Schema.String
/** A bigint as decimal text. */
const BigIntText = Schema.String
const Json = Schema.Unknown

export const FinalizedCounts = Schema.Struct({
  completed: Schema.Number,
  failed: Schema.Number,
  cancelled: Schema.Number
})

export const QueueRates = Schema.Struct({
  enqueued: Schema.Number,
  completed: Schema.Number,
  failed: Schema.Number,
  cancelled: Schema.Number,
  enqueuedPerSecond: Schema.Number,
  completedPerSecond: Schema.Number,
  failedPerSecond: Schema.Number,
  cancelledPerSecond: Schema.Number
})

export const QueueStats = Schema.Struct({
  queue: Schema.String,
  paused: Schema.Boolean,
  available: Schema.Number,
  running: Schema.Number,
  scheduled: Schema.Number,
  retryable: Schema.Number,
  deadLettered: Schema.Number,
  oldestAvailableAt: Schema.NullOr(Instant),
  finalizedTotal: FinalizedCounts,
  recent: FinalizedCounts,
  stored: Schema.NullOr(FinalizedCounts),
  rates: Schema.NullOr(QueueRates)
})

export const QueueStatsReport = Schema.Struct({
  asOf: Instant,
  exact: Schema.Boolean,
  windowStart: Instant,
  staleness: Schema.String,
  rates: Schema.NullOr(
    Schema.Struct({
      start: Instant,
      end: Instant,
      enqueueStart: Schema.NullOr(Instant),
      enqueueEnd: Schema.NullOr(Instant)
    })
  ),
  queues: Schema.Array(QueueStats)
})

export const QueueHistoryReport = Schema.Struct({
  asOf: Instant,
  windowMs: Schema.Number,
  bucketMs: Schema.Number,
  queues: Schema.Array(
    Schema.Struct({
      queue: Schema.String,
      buckets: Schema.Array(
        Schema.Struct({
          start: Instant,
          enqueued: Schema.Number,
          completed: Schema.Number,
          failed: Schema.Number,
          cancelled: Schema.Number
        })
      )
    })
  )
})

export const StorageReport = Schema.Struct({
  schema: Schema.String,
  schemaVersion: Schema.Number,
  latestVersion: Schema.Number,
  now: Instant,
  leader: Schema.NullOr(
    Schema.Struct({ pid: Schema.Number, applicationName: Schema.String, since: Schema.NullOr(Instant) })
  ),
  rings: Schema.Array(
    Schema.Struct({
      ring: Schema.Literals(["queue", "history"]),
      generation: BigIntText,
      slot: Schema.Number,
      oldestUnpruned: Schema.NullOr(
        Schema.Struct({ generation: BigIntText, slot: Schema.Number, since: Schema.NullOr(Instant) })
      ),
      lastPrunedAt: Schema.NullOr(Instant),
      prune: Schema.NullOr(
        Schema.Struct({ outcome: Schema.String, reason: Schema.NullOr(Schema.String), since: Instant })
      ),
      bytes: Schema.Number
    })
  ),
  tables: Schema.Array(Schema.Struct({ table: Schema.String, bytes: Schema.Number }))
})

export const DoctorChecks = Schema.Array(
  Schema.Struct({
    name: Schema.String,
    status: Schema.Literals(["pass", "warn", "fail"]),
    detail: Schema.String,
    fix: Schema.String
  })
)

export const Capabilities = Schema.Struct({
  readOnly: Schema.Boolean,
  authReads: Schema.Boolean,
  actions: Schema.Boolean
})

const ErrorEntry = Schema.Struct({
  error: Schema.String,
  attempt: Schema.Number,
  at: Instant,
  terminal: Schema.optional(Schema.Boolean)
})

const jobFields = {
  id: BigIntText,
  kind: Schema.String,
  queue: Schema.String,
  priority: Schema.Number,
  state: Schema.String,
  attempt: Schema.Number,
  maxAttempts: Schema.Number,
  runLease: BigIntText,
  args: Json,
  metadata: Schema.Record(Schema.String, Json),
  tags: Schema.Array(Schema.String),
  errors: Schema.Array(ErrorEntry),
  progress: Json,
  runAt: Instant,
  createdAt: Instant,
  finalizedAt: Schema.NullOr(Instant),
  dlqReason: Schema.NullOr(Schema.String)
}

export const JobView = Schema.Struct(jobFields)

/** One job with its unique key (hex) and the attempts still stored, each with its duration. */
export const JobPage = Schema.Struct({
  ...jobFields,
  uniqueKey: Schema.NullOr(Schema.String),
  attempts: Schema.Array(
    Schema.Struct({
      attempt: Schema.Number,
      runLease: BigIntText,
      claimedAt: Instant,
      endedAt: Schema.NullOr(Instant),
      outcome: Schema.NullOr(Schema.String),
      durationMs: Schema.NullOr(Schema.Number)
    })
  )
})

export const DlqEntry = Schema.Struct({
  id: BigIntText,
  kind: Schema.String,
  queue: Schema.String,
  priority: Schema.Number,
  args: Json,
  metadata: Schema.Record(Schema.String, Json),
  tags: Schema.Array(Schema.String),
  errors: Schema.Array(ErrorEntry),
  progress: Json,
  attempt: Schema.Number,
  maxAttempts: Schema.Number,
  originalRunLease: BigIntText,
  runAt: Instant,
  createdAt: Instant,
  dlqAt: Instant,
  reason: Schema.String
})

export const CronSnapshot = Schema.Struct({
  now: Instant,
  schedules: Schema.Array(
    Schema.Struct({
      name: Schema.String,
      expression: Schema.String,
      timezone: Schema.String,
      /** The job template (kind, queue, args, priority, …) as the declaring worker stored it. */
      job: Json,
      missedFire: Schema.Union([
        Schema.Struct({ _tag: Schema.Literal("Coalesce") }),
        Schema.Struct({ _tag: Schema.Literal("CatchUp"), max: Schema.Number })
      ]),
      paused: Schema.Boolean,
      pausedBy: Schema.NullOr(Schema.String),
      pausedAt: Schema.NullOr(Instant),
      lastFireAt: Schema.NullOr(Instant),
      lastJobId: Schema.NullOr(BigIntText),
      lastTriggeredAt: Schema.NullOr(Instant),
      declaredAt: Instant,
      updatedAt: Instant,
      scheduleChangedAt: Instant,
      lastDeclaredAt: Instant,
      staleSince: Schema.NullOr(Instant)
    })
  )
})

export const QueuePaused = Schema.Struct({ queue: Schema.String, paused: Schema.Boolean })
export const QueueDrained = Schema.Struct({ queue: Schema.String, cancelled: Schema.Number })
export const Purged = Schema.Struct({ purged: Schema.Number })
export const CronPaused = Schema.Struct({ name: Schema.String, paused: Schema.Boolean })
export const Enqueued = Schema.Struct({
  id: BigIntText,
  state: Schema.Literals(["available", "scheduled"]),
  queue: Schema.String
})

export const Health = Schema.Struct({ status: Schema.Literal("ok"), database: Schema.Literal("reachable") })

export const Ready = Schema.Struct({
  status: Schema.Literal("ready"),
  schemaVersion: Schema.Number,
  leader: Schema.Struct({
    pid: Schema.Number,
    applicationName: Schema.String,
    since: Schema.NullOr(Instant)
  }),
  /** `true`: this process's LISTEN is confirmed; `null`: not checked (no `Readiness` provided). */
  listening: Schema.NullOr(Schema.Boolean)
})
