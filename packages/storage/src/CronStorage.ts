/**
 * `CronStorage`: the control table of periodic schedules (capability 9, docs/adr/0006-cron.md).
 * Storage knows nothing of cron syntax: the runtime (`@awa/runtime` `Cron`) parses expressions and
 * computes ticks; this service stores declarations and performs fires.
 *
 * **Guarantees**
 * - `fire(name, expectedLast, tick, job)` is one atomic step: it re-checks, under the schedule's
 *   lock, that the schedule exists, is not paused, that its last fire is still `expectedLast` and
 *   that `tick` is later than it and not in the future; then it records `tick` as the last fire and
 *   enqueues `job`. Both happen or neither does, so two leaders firing the same tick enqueue one
 *   job, and a crash between evaluation and enqueue neither loses nor repeats a tick.
 * - A fire whose job's unique key is held consumes the tick without a job (`Deduplicated`).
 * - `upsert` is additive: it never deletes, and keeps pause state and the last fire.
 *   `markStale` only marks (and reports) schedules a starting worker does not declare.
 * - `trigger` enqueues the stored job now, whether paused or not, without moving the schedule.
 *
 * Two layers: `layerPg` (table `cron_schedules` and the `cron_*` functions of migration 0005;
 * every timestamp is the database's `now()`) and `layerSim` (in memory, time from `Clock`, so
 * `TestClock` drives it; it enqueues through the `QueueStorage` it is given, normally the
 * `SimQueueStorage` of the same layer).
 *
 * **Gotchas**
 * - Postgres adds `awa:cronName` and `awa:cronFireTime` (the tick, ISO 8601 UTC) to the metadata of
 *   fired jobs, and `awa:cronTriggered: true` to triggered ones. The simulation cannot: its jobs go
 *   through `QueueStorage.enqueueMany`, whose shared checks reject the reserved `awa:` prefix. In
 *   both layers a fired job's `runAt` is its tick.
 * - The simulation has no transactions: `fire` is atomic against the other operations of this
 *   service (one lock), which is all the in-memory engine needs.
 */
import {
  CanonicalJson,
  type CheckedJob,
  checkNewJob,
  type JobState,
  type NewJob,
  type ReadCommittedRequired,
  UniqueConflict,
  UniqueKey,
  type UniqueOptions,
  ValidationError
} from "@awa/core"
import { Migrations } from "@awa/sql"
import { Clock, Context, Effect, Layer, Schema, Semaphore } from "effect"
import { SqlClient, type SqlError } from "effect/sql"
import { type EnqueuedJob, type EnqueueError, type JobId, QueueStorage } from "./QueueStorage.ts"
import * as ReadCommitted from "./ReadCommitted.ts"

/** What a leader does with ticks it missed (outage, pause, slow evaluation). */
export type MissedFire =
  /** One fire, for the latest missed tick, however many were missed. */
  | { readonly _tag: "Coalesce" }
  /** Every missed tick in order, at most `max` (the latest ones) per outage; 1–1000. */
  | { readonly _tag: "CatchUp"; readonly max: number }

/** The job a schedule enqueues, as the declaring code resolved it; `args` are Schema-encoded. */
export interface CronJobTemplate {
  readonly kind: string
  readonly queue: string
  readonly args: unknown
  readonly priority: number
  readonly maxAttempts: number
  readonly tags: ReadonlyArray<string>
  readonly metadata: Readonly<Record<string, unknown>>
  readonly unique?: UniqueOptions | undefined
}

export interface CronDeclaration {
  /** 1–200 characters, no NUL. */
  readonly name: string
  /** Checked by the runtime (croner); storage only requires a non-empty string. */
  readonly expression: string
  /** IANA zone name, checked by the runtime. */
  readonly timezone: string
  readonly job: CronJobTemplate
  readonly missedFire: MissedFire
}

export interface CronScheduleState extends CronDeclaration {
  readonly paused: boolean
  readonly pausedBy: string | null
  readonly pausedAt: Date | null
  /** The last tick fired (the compare-and-swap value); null before the first fire. */
  readonly lastFireAt: Date | null
  /** The job of the last fire; null before the first fire or when it was deduplicated. */
  readonly lastJobId: JobId | null
  readonly lastTriggeredAt: Date | null
  /** First declared. */
  readonly declaredAt: Date
  /** Definition or pause state last changed. */
  readonly updatedAt: Date
  /** Expression or time zone last changed: ticks before this minus one minute are never due. */
  readonly scheduleChangedAt: Date
  /** Last upserted by a starting worker. */
  readonly lastDeclaredAt: Date
  /** Since when a starting worker did not declare it (cleared when one does); null if declared. */
  readonly staleSince: Date | null
}

/** Every schedule, with the storage clock's `now` (the database's, on Postgres). */
export interface CronSnapshot {
  readonly now: Date
  readonly schedules: ReadonlyArray<CronScheduleState>
}

export interface UpsertResult {
  readonly name: string
  readonly created: boolean
  /** An existing schedule whose definition changed. */
  readonly changed: boolean
}

export type SkipReason = "not_found" | "paused" | "stale" | "not_due"

export type FireResult =
  | { readonly _tag: "Fired"; readonly jobId: JobId }
  /** The job's unique key is held by `existingJobId`: the tick is consumed, no job is enqueued. */
  | { readonly _tag: "Deduplicated"; readonly existingJobId: JobId }
  /** Nothing was written. */
  | { readonly _tag: "Skipped"; readonly reason: SkipReason }

/** No schedule with this name. */
export class CronNotFound extends Schema.TaggedError<CronNotFound>()("CronNotFound", {
  name: Schema.String
}) {
  override get message(): string {
    return `no cron schedule named "${this.name}"`
  }
}

export const limits = {
  nameMaxLength: 200,
  expressionMaxLength: 1000,
  catchUpMax: 1000
} as const

export class CronStorage extends Context.Service<
  CronStorage,
  {
    /** Inserts or updates declared schedules (additive); results in name order. */
    readonly upsert: (
      declarations: ReadonlyArray<CronDeclaration>
    ) => Effect.Effect<ReadonlyArray<UpsertResult>, ValidationError | SqlError.SqlError>
    /** Every schedule in name order (UTF-8 byte order), with the storage clock's now. */
    readonly list: Effect.Effect<CronSnapshot, SqlError.SqlError>
    /** Marks (and returns) every stored schedule whose name is not in `declared`; deletes nothing. */
    readonly markStale: (
      declared: ReadonlyArray<string>
    ) => Effect.Effect<ReadonlyArray<CronScheduleState>, SqlError.SqlError>
    readonly pause: (name: string, by?: string) => Effect.Effect<void, CronNotFound | SqlError.SqlError>
    readonly resume: (name: string) => Effect.Effect<void, CronNotFound | SqlError.SqlError>
    /** One fire of one tick, atomically (see the module's guarantees). */
    readonly fire: (
      name: string,
      expectedLast: Date | null,
      tick: Date,
      job: NewJob
    ) => Effect.Effect<FireResult, ValidationError | ReadCommittedRequired | SqlError.SqlError>
    /** Enqueues the schedule's stored job now; ignores pause, does not move the schedule. */
    readonly trigger: (
      name: string
    ) => Effect.Effect<EnqueuedJob, CronNotFound | ReadCommittedRequired | EnqueueError>
    /** Deletes a schedule; false when there was none. A worker still declaring it re-creates it at start. */
    readonly remove: (name: string) => Effect.Effect<boolean, SqlError.SqlError>
  }
>()("@awa/storage/CronStorage") {}

// -----------------------------------------------------------------------------------------------
// Shared helpers

/** The job a schedule enqueues; a fired job runs at its tick (`runAt`), a triggered one now. */
export const toNewJob = (job: CronJobTemplate, runAt?: Date): NewJob => ({
  kind: job.kind,
  queue: job.queue,
  priority: job.priority,
  maxAttempts: job.maxAttempts,
  args: job.args,
  metadata: job.metadata,
  tags: job.tags,
  unique: job.unique,
  runAt
})

const invalid = (field: string, reason: string) => new ValidationError({ field, reason })

/** Checks a declaration the way both layers store it; returns the checked job. */
const checkDeclaration = (d: CronDeclaration, nowMillis: number) =>
  Effect.gen(function* () {
    const field = `cron.${d.name}`
    if (typeof d.name !== "string" || d.name.length < 1 || d.name.length > limits.nameMaxLength)
      return yield* invalid("cron.name", `must be 1–${limits.nameMaxLength} characters`)
    if (d.name.includes("\u0000")) return yield* invalid("cron.name", "must not contain NUL")
    if (
      typeof d.expression !== "string" ||
      d.expression.trim().length === 0 ||
      d.expression.length > limits.expressionMaxLength
    )
      return yield* invalid(`${field}.expression`, `must be 1–${limits.expressionMaxLength} characters`)
    if (typeof d.timezone !== "string" || d.timezone.length === 0)
      return yield* invalid(`${field}.timezone`, "must be an IANA time zone name")
    if (
      d.missedFire._tag === "CatchUp" &&
      !(Number.isInteger(d.missedFire.max) && d.missedFire.max >= 1 && d.missedFire.max <= limits.catchUpMax)
    )
      return yield* invalid(`${field}.missedFire.catchUp.max`, `must be an integer 1–${limits.catchUpMax}`)
    return yield* checkNewJob(toNewJob(d.job), { nowMillis }).pipe(
      Effect.mapError((e) => invalid(`${field}.job.${e.field}`, e.reason))
    )
  })

const checkDeclarations = (declarations: ReadonlyArray<CronDeclaration>, nowMillis: number) =>
  Effect.gen(function* () {
    const seen = new Set<string>()
    const checked: Array<{ readonly declaration: CronDeclaration; readonly job: CheckedJob }> = []
    for (const declaration of declarations) {
      if (seen.has(declaration.name)) return yield* invalid(`cron.${declaration.name}`, "declared twice")
      seen.add(declaration.name)
      checked.push({ declaration, job: yield* checkDeclaration(declaration, nowMillis) })
    }
    return checked.sort((a, b) => CanonicalJson.compareUtf8(a.declaration.name, b.declaration.name))
  })

interface StoredOptions {
  readonly priority: number
  readonly max_attempts: number
  readonly tags: ReadonlyArray<string>
  readonly metadata: Readonly<Record<string, unknown>>
  readonly unique?:
    | {
        readonly by_queue?: boolean | undefined
        readonly by_args?: boolean | undefined
        readonly by_period_ms?: number | undefined
        readonly states?: ReadonlyArray<JobState> | undefined
      }
    | undefined
}

/** The `options` document of a stored schedule (snake_case, canonical JSON). */
const optionsJson = (job: CheckedJob, unique: UniqueOptions | undefined): string => {
  const options: StoredOptions = {
    priority: job.priority,
    max_attempts: job.maxAttempts,
    tags: job.tags,
    metadata: JSON.parse(job.metadataJson),
    ...(unique === undefined
      ? {}
      : {
          unique: {
            ...(unique.byQueue === undefined ? {} : { by_queue: unique.byQueue }),
            ...(unique.byArgs === undefined ? {} : { by_args: unique.byArgs }),
            ...(unique.byPeriodMs === undefined ? {} : { by_period_ms: unique.byPeriodMs }),
            ...(unique.states === undefined ? {} : { states: unique.states })
          }
        })
  }
  return CanonicalJson.canonicalJson(options, "options")
}

const templateOf = (kind: string, queue: string, args: unknown, options: StoredOptions): CronJobTemplate => {
  const u = options.unique
  return {
    kind,
    queue,
    args,
    priority: options.priority,
    maxAttempts: options.max_attempts,
    tags: options.tags ?? [],
    metadata: options.metadata ?? {},
    ...(u === undefined
      ? {}
      : {
          unique: {
            ...(u.by_queue === undefined ? {} : { byQueue: u.by_queue }),
            ...(u.by_args === undefined ? {} : { byArgs: u.by_args }),
            ...(u.by_period_ms === undefined ? {} : { byPeriodMs: u.by_period_ms }),
            ...(u.states === undefined ? {} : { states: u.states })
          }
        })
  }
}

const missedFireOf = (missedFire: string, catchUpMax: number | null): MissedFire =>
  missedFire === "catch_up" ? { _tag: "CatchUp", max: catchUpMax ?? 1 } : { _tag: "Coalesce" }

const sameInstant = (a: Date | null, b: Date | null) =>
  a === null || b === null ? a === b : a.getTime() === b.getTime()

// -----------------------------------------------------------------------------------------------
// Postgres

export interface PgCronStorageOptions {
  /** Schema Awa is installed in. Default `"awa"`. */
  readonly schema?: string | undefined
  /** Largest encoded args accepted (as `PgQueueStorage`). Default 1 MiB. */
  readonly maxArgsBytes?: number | undefined
}

interface ScheduleRow {
  readonly name: string
  readonly expression: string
  readonly timezone: string
  readonly kind: string
  readonly queue: string
  readonly args: unknown
  readonly options: StoredOptions
  readonly missed_fire: string
  readonly catch_up_max: number | null
  readonly paused: boolean
  readonly paused_by: string | null
  readonly paused_at: Date | null
  readonly last_fire_at: Date | null
  readonly last_job_id: bigint | null
  readonly last_triggered_at: Date | null
  readonly declared_at: Date
  readonly updated_at: Date
  readonly schedule_changed_at: Date
  readonly last_declared_at: Date
  readonly stale_since: Date | null
}

const fromRow = (row: ScheduleRow): CronScheduleState => ({
  name: row.name,
  expression: row.expression,
  timezone: row.timezone,
  job: templateOf(row.kind, row.queue, row.args, row.options),
  missedFire: missedFireOf(row.missed_fire, row.catch_up_max),
  paused: row.paused,
  pausedBy: row.paused_by,
  pausedAt: row.paused_at,
  lastFireAt: row.last_fire_at,
  lastJobId: row.last_job_id,
  lastTriggeredAt: row.last_triggered_at,
  declaredAt: row.declared_at,
  updatedAt: row.updated_at,
  scheduleChangedAt: row.schedule_changed_at,
  lastDeclaredAt: row.last_declared_at,
  staleSince: row.stale_since
})

/** One row in the input format of the SQL `enqueue(jsonb)` function (as `PgQueueStorage` builds it). */
const enqueueRowJson = (job: CheckedJob): string =>
  `{"kind":${JSON.stringify(job.kind)},"queue":${JSON.stringify(job.queue)},"priority":${job.priority},` +
  `"args":${job.argsJson},"metadata":${job.metadataJson},"tags":${JSON.stringify(job.tags)},` +
  `"max_attempts":${job.maxAttempts},"run_at":${job.runAt ? JSON.stringify(job.runAt.toISOString()) : "null"},` +
  `"unique_key":${job.uniqueKey ? `"${UniqueKey.toHex(job.uniqueKey)}"` : "null"},"unique_states":${job.uniqueStates}}`

export const makePg = Effect.fnUntraced(function* (options: PgCronStorageOptions = {}) {
  const sql = yield* SqlClient.SqlClient
  const schema = yield* Migrations.checkSchemaName(options.schema ?? Migrations.defaultSchema)
  const s = sql(schema)
  // fire and trigger need READ COMMITTED (migration 0027)
  const rc = ReadCommitted.make(sql)
  const check = (job: NewJob) =>
    Effect.flatMap(Clock.currentTimeMillis, (nowMillis) =>
      checkNewJob(job, { nowMillis, maxArgsBytes: options.maxArgsBytes })
    )

  const upsert = (declarations: ReadonlyArray<CronDeclaration>) =>
    Effect.gen(function* () {
      if (declarations.length === 0) return []
      const checked = yield* checkDeclarations(declarations, yield* Clock.currentTimeMillis)
      const rows = checked.map(({ declaration: d, job }) => {
        const catchUpMax = d.missedFire._tag === "CatchUp" ? d.missedFire.max : null
        return (
          `{"name":${JSON.stringify(d.name)},"expression":${JSON.stringify(d.expression)},` +
          `"timezone":${JSON.stringify(d.timezone)},"kind":${JSON.stringify(job.kind)},` +
          `"queue":${JSON.stringify(job.queue)},"args":${job.argsJson},"options":${optionsJson(job, d.job.unique)},` +
          `"missed_fire":"${d.missedFire._tag === "CatchUp" ? "catch_up" : "coalesce"}","catch_up_max":${catchUpMax}}`
        )
      })
      return yield* sql<UpsertResult>`
        SELECT name, created, changed FROM ${s}.cron_upsert(${`[${rows.join(",")}]`}::jsonb)`
    }).pipe(Effect.withSpan("CronStorage.upsert", { attributes: { count: declarations.length } }))

  const list = Effect.gen(function* () {
    const rows = yield* sql<ScheduleRow & { readonly db_now: Date }>`
      SELECT now() AS db_now, c.* FROM (SELECT 1) AS one
      LEFT JOIN ${s}.cron_schedules c ON true
      ORDER BY c.name COLLATE "C"`
    return {
      now: rows[0]!.db_now,
      schedules: rows.filter((row) => row.name !== null).map(fromRow)
    } satisfies CronSnapshot
  }).pipe(Effect.withSpan("CronStorage.list"))

  const markStale = (declared: ReadonlyArray<string>) =>
    Effect.map(
      sql<ScheduleRow>`
        SELECT * FROM ${s}.cron_mark_stale(ARRAY(SELECT jsonb_array_elements_text(${JSON.stringify(declared)}::jsonb)))`,
      (rows) => rows.map(fromRow)
    ).pipe(Effect.withSpan("CronStorage.markStale"))

  const setPaused = (name: string, paused: boolean, by: string | null) =>
    Effect.gen(function* () {
      const [row] = yield* sql<{ found: boolean }>`
        SELECT ${s}.cron_set_paused(${name}, ${paused}, ${by}::text) AS found`
      if (!row?.found) return yield* new CronNotFound({ name })
    })

  const fire = (name: string, expectedLast: Date | null, tick: Date, job: NewJob) =>
    Effect.gen(function* () {
      const checked = yield* check(job)
      const [row] = yield* rc(
        "cronFire",
        sql<{ outcome: string; job_id: bigint | null }>`
          SELECT outcome, job_id FROM ${s}.cron_fire(
            ${name}, ${expectedLast === null ? null : expectedLast.toISOString()}::timestamptz,
            ${tick.toISOString()}::timestamptz, ${enqueueRowJson(checked)}::jsonb)`
      )
      switch (row?.outcome) {
        case "fired":
          return { _tag: "Fired", jobId: row.job_id! } satisfies FireResult
        case "deduplicated":
          return { _tag: "Deduplicated", existingJobId: row.job_id ?? 0n } satisfies FireResult
        default:
          return { _tag: "Skipped", reason: (row?.outcome ?? "not_found") as SkipReason } satisfies FireResult
      }
    }).pipe(Effect.withSpan("CronStorage.fire", { attributes: { name, tick: tick.toISOString() } }))

  const trigger = (name: string) =>
    Effect.gen(function* () {
      const [row] = yield* sql<Pick<ScheduleRow, "kind" | "queue" | "args" | "options">>`
        SELECT kind, queue, args, options FROM ${s}.cron_schedules WHERE name = ${name}`
      if (row === undefined) return yield* new CronNotFound({ name })
      const checked = yield* check(toNewJob(templateOf(row.kind, row.queue, row.args, row.options)))
      const [out] = yield* rc(
        "cronTrigger",
        sql<{ job_id: bigint | null; state: "available" | "scheduled" | "duplicate" }>`
          SELECT job_id, state FROM ${s}.cron_trigger(${name}, ${enqueueRowJson(checked)}::jsonb)`
      )
      if (out === undefined) return yield* new CronNotFound({ name })
      // a held unique key is an answer, not a server error (migration 0018): nothing was written
      if (out.state === "duplicate")
        return yield* new UniqueConflict({
          key: UniqueKey.toHex(checked.uniqueKey!),
          existingJobId: out.job_id ?? 0n
        })
      return { id: out.job_id!, state: out.state, queue: checked.queue } satisfies EnqueuedJob
    }).pipe(Effect.withSpan("CronStorage.trigger", { attributes: { name } }))

  const remove = (name: string) =>
    Effect.map(
      sql<{ found: boolean }>`SELECT ${s}.cron_remove(${name}) AS found`,
      ([row]) => row?.found === true
    )

  return CronStorage.of({
    upsert,
    list,
    markStale,
    pause: (name, by) => setPaused(name, true, by ?? null),
    resume: (name) => setPaused(name, false, null),
    fire,
    trigger,
    remove
  })
})

/** The Postgres layer; needs the application's `SqlClient` and migration 0005. */
export const layerPg = (options: PgCronStorageOptions = {}) => Layer.effect(CronStorage, makePg(options))

// -----------------------------------------------------------------------------------------------
// Simulation

interface SimSchedule {
  readonly name: string
  expression: string
  timezone: string
  kind: string
  queue: string
  argsJson: string
  optionsJson: string
  missedFire: MissedFire
  definitionKey: string
  paused: boolean
  pausedBy: string | null
  pausedAt: number | null
  lastFireAt: number | null
  lastJobId: JobId | null
  lastTriggeredAt: number | null
  readonly declaredAt: number
  updatedAt: number
  scheduleChangedAt: number
  lastDeclaredAt: number
  staleSince: number | null
}

const date = (millis: number | null): Date | null => (millis === null ? null : new Date(millis))

const simState = (s: SimSchedule): CronScheduleState => ({
  name: s.name,
  expression: s.expression,
  timezone: s.timezone,
  job: templateOf(s.kind, s.queue, JSON.parse(s.argsJson), JSON.parse(s.optionsJson)),
  missedFire: s.missedFire,
  paused: s.paused,
  pausedBy: s.pausedBy,
  pausedAt: date(s.pausedAt),
  lastFireAt: date(s.lastFireAt),
  lastJobId: s.lastJobId,
  lastTriggeredAt: date(s.lastTriggeredAt),
  declaredAt: new Date(s.declaredAt),
  updatedAt: new Date(s.updatedAt),
  scheduleChangedAt: new Date(s.scheduleChangedAt),
  lastDeclaredAt: new Date(s.lastDeclaredAt),
  staleSince: date(s.staleSince)
})

export const makeSim = Effect.gen(function* () {
  const queue = yield* QueueStorage
  const schedules = new Map<string, SimSchedule>()
  // Every operation runs under one lock: fire's check, enqueue and record cannot interleave with
  // another fire, a pause or an upsert.
  const lock = yield* Semaphore.make(1)
  const locked = Semaphore.withPermit(lock)
  const sorted = () =>
    [...schedules.values()].sort((a, b) => CanonicalJson.compareUtf8(a.name, b.name)).map(simState)

  const upsert = (declarations: ReadonlyArray<CronDeclaration>) =>
    Effect.gen(function* () {
      const now = yield* Clock.currentTimeMillis
      const checked = yield* checkDeclarations(declarations, now)
      const results: Array<UpsertResult> = []
      for (const { declaration: d, job } of checked) {
        const options = optionsJson(job, d.job.unique)
        const definitionKey = CanonicalJson.canonicalJson(
          [
            d.expression,
            d.timezone,
            job.kind,
            job.queue,
            JSON.parse(job.argsJson),
            JSON.parse(options),
            d.missedFire
          ],
          "cron"
        )
        const existing = schedules.get(d.name)
        if (existing === undefined) {
          schedules.set(d.name, {
            name: d.name,
            expression: d.expression,
            timezone: d.timezone,
            kind: job.kind,
            queue: job.queue,
            argsJson: job.argsJson,
            optionsJson: options,
            missedFire: d.missedFire,
            definitionKey,
            paused: false,
            pausedBy: null,
            pausedAt: null,
            lastFireAt: null,
            lastJobId: null,
            lastTriggeredAt: null,
            declaredAt: now,
            updatedAt: now,
            scheduleChangedAt: now,
            lastDeclaredAt: now,
            staleSince: null
          })
          results.push({ name: d.name, created: true, changed: false })
          continue
        }
        const changed = existing.definitionKey !== definitionKey
        if (existing.expression !== d.expression || existing.timezone !== d.timezone)
          existing.scheduleChangedAt = now
        if (changed) existing.updatedAt = now
        existing.expression = d.expression
        existing.timezone = d.timezone
        existing.kind = job.kind
        existing.queue = job.queue
        existing.argsJson = job.argsJson
        existing.optionsJson = options
        existing.missedFire = d.missedFire
        existing.definitionKey = definitionKey
        existing.lastDeclaredAt = now
        existing.staleSince = null
        results.push({ name: d.name, created: false, changed })
      }
      return results
    }).pipe(locked)

  const list = Effect.map(
    Clock.currentTimeMillis,
    (now): CronSnapshot => ({ now: new Date(now), schedules: sorted() })
  )

  const markStale = (declared: ReadonlyArray<string>) =>
    Effect.gen(function* () {
      const now = yield* Clock.currentTimeMillis
      const names = new Set(declared)
      for (const s of schedules.values()) if (!names.has(s.name)) s.staleSince ??= now
      return sorted().filter((s) => !names.has(s.name))
    }).pipe(locked)

  const setPaused = (name: string, paused: boolean, by: string | null) =>
    Effect.gen(function* () {
      const now = yield* Clock.currentTimeMillis
      const s = schedules.get(name)
      if (s === undefined) return yield* new CronNotFound({ name })
      if (s.paused === paused) return
      s.paused = paused
      s.pausedBy = paused ? by : null
      s.pausedAt = paused ? now : null
      s.updatedAt = now
    }).pipe(locked)

  const fire = (name: string, expectedLast: Date | null, tick: Date, job: NewJob) =>
    Effect.gen(function* () {
      yield* checkNewJob(job, { nowMillis: yield* Clock.currentTimeMillis })
      return yield* Effect.gen(function* () {
        const now = yield* Clock.currentTimeMillis
        const s = schedules.get(name)
        const skipped = (reason: SkipReason): FireResult => ({ _tag: "Skipped", reason })
        if (s === undefined) return skipped("not_found")
        if (s.paused) return skipped("paused")
        if (!sameInstant(date(s.lastFireAt), expectedLast)) return skipped("stale")
        if (s.lastFireAt !== null && tick.getTime() <= s.lastFireAt) return skipped("stale")
        if (tick.getTime() > now) return skipped("not_due")
        const enqueued = yield* queue.enqueueMany([job]).pipe(
          Effect.map((jobs) => jobs[0]!.id),
          Effect.catchTag("UniqueConflict", (conflict) => Effect.succeed(conflict))
        )
        s.lastFireAt = tick.getTime()
        if (enqueued instanceof UniqueConflict) {
          s.lastJobId = null
          return { _tag: "Deduplicated", existingJobId: enqueued.existingJobId } satisfies FireResult
        }
        s.lastJobId = enqueued
        return { _tag: "Fired", jobId: enqueued } satisfies FireResult
      }).pipe(locked)
    })

  const trigger = (name: string) =>
    Effect.gen(function* () {
      const now = yield* Clock.currentTimeMillis
      const s = schedules.get(name)
      if (s === undefined) return yield* new CronNotFound({ name })
      const template = simState(s).job
      const [job] = yield* queue.enqueueMany([toNewJob(template)])
      s.lastTriggeredAt = now
      return job!
    }).pipe(locked)

  const remove = (name: string) => Effect.sync(() => schedules.delete(name)).pipe(locked)

  return CronStorage.of({
    upsert,
    list,
    markStale,
    pause: (name, by) => setPaused(name, true, by ?? null),
    resume: (name) => setPaused(name, false, null),
    fire,
    trigger,
    remove
  })
})

/**
 * In memory, deterministic under `TestClock`; enqueues through the `QueueStorage` it is given
 * (provide the same `SimQueueStorage` instance the rest of the application uses).
 */
export const layerSim: Layer.Layer<CronStorage, never, QueueStorage> = Layer.effect(CronStorage, makeSim)
