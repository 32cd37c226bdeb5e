/**
 * Periodic jobs (capability 9, docs/cron.md, docs/adr/0006-cron.md).
 *
 * ```ts
 * const nightly = Cron.schedule({
 *   name: "nightly-report",
 *   cron: "30 2 * * *",                 // 5 fields, or 6 with seconds first
 *   timezone: "Europe/Berlin",          // IANA zone, default "UTC"
 *   job: Report,                        // a Job.define(...) definition
 *   args: { scope: "all" },
 *   missedFire: { catchUp: { max: 7 } } // default "coalesce"
 * })
 * Awa.worker({ queues: { default: {} }, handlers: [report], cron: [nightly] })
 * ```
 *
 * **Guarantees**
 * - Declarations are checked when the worker layer is built, before anything starts or is
 *   written: an invalid expression, an unknown time zone, a duplicate or invalid name, a bad
 *   missed-fire bound, args the job's Schema cannot encode and job options out of range all fail
 *   with one `AwaConfigError` naming every issue (`cron.<name>.<field>`).
 * - A starting worker upserts its declarations (additive; pause state and last fire are kept)
 *   and logs the stored schedules it does not declare as stale; nothing is deleted.
 * - Only the maintenance leader evaluates schedules, every `maintenance.cronInterval` (1 s), and
 *   it evaluates every stored schedule (also those declared by other deployments). Each fire is
 *   one atomic storage step guarded by the schedule's last fire (`CronStorage.fire`): a tick is
 *   never enqueued twice, even by two leaders, and a crash never loses one.
 * - Missed ticks (outage, pause, failover): `coalesce` fires once, for the latest; `catchUp`
 *   fires each in order, at most `max` (the latest ones, default 100, at most 1000) per
 *   evaluation. A schedule never fired before (or whose expression or zone changed) looks back
 *   one minute from its declaration (or change), never further.
 * - A fired job's `runAt` is its tick; on Postgres its metadata also carries `awa:cronName` and
 *   `awa:cronFireTime`.
 *
 * **Gotchas** Times come from the storage clock (the database's `now()`); croner computes ticks.
 * Daylight-saving days behave as croner 10 does (see docs/cron.md): on spring-forward days the
 * first tick inside the skipped hour fires once, shifted forward by the gap, and the others in it
 * are dropped; on fall-back days the repeated hour runs once, in its first occurrence. croner's
 * `nextRun` can return an earlier instant when started inside the repeated hour; `nextTick`
 * corrects for that.
 */
import { AwaConfigError, checkNewJob, Job, type ReadCommittedRequired } from "@awa/core"
import { CronStorage, type EnqueuedJob, type EnqueueError } from "@awa/storage"
import { Cron as Croner } from "croner"
import { Clock, Effect, Schema } from "effect"
import type { SqlError } from "effect/sql"

type CronStorageService = CronStorage.CronStorage["Service"]

/** Job options a schedule may set (a fire's run time is its tick, so no `runAt`/`delay`). */
export type CronInsertOptions = Omit<Job.InsertOptions, "runAt" | "delay">

export type MissedFireInput =
  /** One fire for any number of missed ticks, for the latest (default). */
  | "coalesce"
  /** Every missed tick, in order, at most `max` (the latest ones; default 100, 1–1000). */
  | { readonly catchUp: { readonly max?: number | undefined } }

export interface ScheduleOptions<A, I> {
  /** Unique across the deployment: 1–200 characters, no NUL. */
  readonly name: string
  /** 5 fields (`m h dom mon dow`), 6 with seconds first, or `@hourly`/`@daily`/`@weekly`/`@monthly`/`@yearly`. */
  readonly cron: string
  /** IANA time zone the expression is read in. Default `"UTC"`. */
  readonly timezone?: string | undefined
  readonly job: Job.JobDefinition<A, I>
  readonly args: A
  /** Merged over the job definition's defaults (whose `runAt`/`delay` are ignored). */
  readonly options?: CronInsertOptions | undefined
  readonly missedFire?: MissedFireInput | undefined
}

/** A declared schedule; checked when the worker layer is built (`check`). */
export interface CronSchedule {
  readonly _tag: "CronSchedule"
  readonly name: string
  readonly cron: string
  readonly timezone: string
  readonly job: Job.JobDefinition<any, any>
  readonly args: unknown
  readonly options: CronInsertOptions
  readonly missedFire: MissedFireInput
}

export const defaultCatchUpMax = 100

/** Declares a schedule. Nothing is checked here: `check` (run by the worker layer) reports every issue. */
export const schedule = <A, I>(options: ScheduleOptions<A, I>): CronSchedule => ({
  _tag: "CronSchedule",
  name: options.name,
  cron: options.cron,
  timezone: options.timezone ?? "UTC",
  job: options.job,
  args: options.args,
  options: options.options ?? {},
  missedFire: options.missedFire ?? "coalesce"
})

// -----------------------------------------------------------------------------------------------
// Expressions and ticks

const nicknames = new Set(["@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly"])

const isTimeZone = (timezone: string): boolean => {
  try {
    new Intl.DateTimeFormat("en-US", { timeZone: timezone })
    return true
  } catch {
    return false
  }
}

/** A parsed expression, or why it is not one. Never starts a timer. */
export const parse = (
  expression: string,
  timezone: string
):
  | { readonly _tag: "Ok"; readonly cron: Croner }
  | { readonly _tag: "Invalid"; readonly path: "cron" | "timezone"; readonly reason: string } => {
  if (typeof timezone !== "string" || !isTimeZone(timezone))
    return { _tag: "Invalid", path: "timezone", reason: `unknown time zone ${JSON.stringify(timezone)}` }
  if (typeof expression !== "string") return { _tag: "Invalid", path: "cron", reason: "must be a string" }
  const trimmed = expression.trim()
  const fields = trimmed.split(/\s+/).length
  if (!(nicknames.has(trimmed.toLowerCase()) || fields === 5 || fields === 6))
    return {
      _tag: "Invalid",
      path: "cron",
      reason: `${JSON.stringify(expression)} must have 5 fields, or 6 with seconds (got ${trimmed === "" ? 0 : fields})`
    }
  // croner reads any pattern with a ":" as a one-shot date
  if (trimmed.includes(":"))
    return { _tag: "Invalid", path: "cron", reason: `${JSON.stringify(expression)} is not a cron expression` }
  try {
    const cron = new Croner(trimmed, { timezone, mode: "5-or-6-parts" })
    // croner resolves the zone lazily: make it fail here, not in the leader
    cron.nextRun(new Date(0))
    return { _tag: "Ok", cron }
  } catch (error) {
    return { _tag: "Invalid", path: "cron", reason: error instanceof Error ? error.message : String(error) }
  }
}

/**
 * The first tick strictly after `after`. croner 10 can return an earlier instant when `after`
 * lies in the second occurrence of a repeated (fall-back) hour; stepping on from that result
 * reaches the first tick after `after` (croner never yields ticks inside the second occurrence).
 */
export const nextTick = (cron: Croner, after: number): number | undefined => {
  let next = cron.nextRun(new Date(after))
  for (let guard = 0; next !== null && next.getTime() <= after; guard++) {
    if (guard > 100_000) return undefined
    next = cron.nextRun(next)
  }
  return next === null ? undefined : next.getTime()
}

/** The ticks in `(from, until]`, in order; stops (incomplete) once there are more than `cap`. */
const walk = (cron: Croner, from: number, until: number, cap: number) => {
  const ticks: Array<number> = []
  for (let t = nextTick(cron, from); t !== undefined && t <= until; t = nextTick(cron, t)) {
    if (ticks.length === cap) return { ticks, complete: false }
    ticks.push(t)
  }
  return { ticks, complete: true }
}

/**
 * The latest `max` ticks in `(after, until]`, in order; `more` when earlier ones were left out.
 *
 * croner only steps forward, and each step costs a time-zone conversion (about 0.5 ms), so a long
 * backlog (an every-second schedule after a day's outage) is never walked whole: past `4 × max`
 * ticks, a window `(until − w, until]` holding between `max` and `4 × max` of them is found by
 * doubling `w`, then bisecting (the count grows by at most one per millisecond of width, so such a
 * window exists), and only that window is walked.
 */
export const dueTicks = (
  cron: Croner,
  after: number,
  until: number,
  max: number
): { readonly ticks: ReadonlyArray<number>; readonly more: boolean } => {
  const cap = 4 * max + 4
  const all = walk(cron, after, until, cap)
  if (all.complete) return { ticks: all.ticks.slice(-max), more: all.ticks.length > max }
  let lo = 0 // a width holding fewer than `max` ticks
  let hi = until - after // a width holding more than `cap`
  let bracketed = false
  let width = 1000
  while (hi - lo > 1) {
    const w = Math.max(lo + 1, Math.min(width, hi - 1))
    const window = walk(cron, until - w, until, cap)
    if (!window.complete) {
      hi = w
      bracketed = true
    } else if (window.ticks.length >= max) return { ticks: window.ticks.slice(-max), more: true }
    else lo = w
    width = bracketed ? Math.floor((lo + hi) / 2) : w * 2
  }
  // unreachable (see above); fall back to the window just below `hi`
  return { ticks: walk(cron, until - lo, until, cap).ticks.slice(-max), more: true }
}

/** The latest tick in `(after, until]`. */
export const latestTick = (cron: Croner, after: number, until: number): number | undefined =>
  dueTicks(cron, after, until, 1).ticks[0]

// -----------------------------------------------------------------------------------------------
// Checking declarations

interface Issue {
  readonly path: string
  readonly reason: string
}

const issue = (path: string, reason: string): Issue => ({ path, reason })

/**
 * Checks declarations and resolves them for storage, appending every problem to `issues`
 * (paths `cron.<name>…`). Used by the worker's configuration check.
 */
export const resolve = (schedules: ReadonlyArray<CronSchedule>, issues: Array<Issue>) =>
  Effect.gen(function* () {
    const nowMillis = yield* Clock.currentTimeMillis
    const declarations: Array<CronStorage.CronDeclaration> = []
    const seen = new Set<string>()
    for (const [i, s] of schedules.entries()) {
      const validName =
        typeof s.name === "string" &&
        s.name.length >= 1 &&
        s.name.length <= CronStorage.limits.nameMaxLength &&
        !s.name.includes("\u0000")
      const path = validName ? `cron.${s.name}` : `cron[${i}]`
      if (!validName) {
        issues.push(
          issue(`${path}.name`, `must be 1–${CronStorage.limits.nameMaxLength} characters without NUL`)
        )
      } else if (seen.has(s.name)) {
        issues.push(issue(path, "declared twice"))
        continue
      }
      seen.add(s.name)
      const before = issues.length
      // an unknown zone is reported, and the expression is still checked (in UTC)
      const zoneKnown = typeof s.timezone === "string" && isTimeZone(s.timezone)
      if (!zoneKnown)
        issues.push(issue(`${path}.timezone`, `unknown time zone ${JSON.stringify(s.timezone)}`))
      const parsed = parse(s.cron, zoneKnown ? s.timezone : "UTC")
      if (parsed._tag === "Invalid") issues.push(issue(`${path}.${parsed.path}`, parsed.reason))
      else if (nextTick(parsed.cron, nowMillis) === undefined)
        issues.push(issue(`${path}.cron`, `${JSON.stringify(s.cron)} never fires`))
      let missedFire: CronStorage.MissedFire = { _tag: "Coalesce" }
      if (s.missedFire !== "coalesce") {
        const max =
          typeof s.missedFire === "object" ? (s.missedFire.catchUp?.max ?? defaultCatchUpMax) : Number.NaN
        if (!(Number.isInteger(max) && max >= 1 && max <= CronStorage.limits.catchUpMax))
          issues.push(
            issue(
              `${path}.missedFire`,
              `must be "coalesce" or { catchUp: { max } } with max an integer 1–${CronStorage.limits.catchUpMax}`
            )
          )
        missedFire = { _tag: "CatchUp", max }
      }
      const encoded = yield* Effect.result(Schema.encodeEffect(Job.argsCodec(s.job.args))(s.args))
      if (encoded._tag === "Failure") {
        issues.push(issue(`${path}.args`, encoded.failure.message))
        continue
      }
      const merged = { ...s.job.defaults, ...s.options }
      const job: CronStorage.CronJobTemplate = {
        kind: s.job.kind,
        queue: merged.queue ?? "default",
        args: encoded.success,
        priority: merged.priority ?? 2,
        maxAttempts: merged.maxAttempts ?? 25,
        tags: merged.tags ?? [],
        metadata: merged.metadata ?? {},
        ...(merged.unique === undefined ? {} : { unique: merged.unique })
      }
      const checked = yield* Effect.result(checkNewJob(CronStorage.toNewJob(job), { nowMillis }))
      if (checked._tag === "Failure")
        issues.push(issue(`${path}.${checked.failure.field}`, checked.failure.reason))
      if (issues.length === before && validName)
        declarations.push({ name: s.name, expression: s.cron.trim(), timezone: s.timezone, job, missedFire })
    }
    return declarations
  })

/** Checks declarations on their own: one `AwaConfigError` naming every issue. */
export const check = (schedules: ReadonlyArray<CronSchedule>) =>
  Effect.gen(function* () {
    const issues: Array<Issue> = []
    const declarations = yield* resolve(schedules, issues)
    if (issues.length > 0) return yield* new AwaConfigError({ issues })
    return declarations
  })

// -----------------------------------------------------------------------------------------------
// Worker start

/**
 * Upserts a worker's declarations and logs the stored schedules it does not declare (marked
 * stale, never deleted: another deployment may still declare them, and they keep firing until
 * paused or removed).
 */
export const declare = (declarations: ReadonlyArray<CronStorage.CronDeclaration>) =>
  Effect.gen(function* () {
    const storage = yield* CronStorage.CronStorage
    // `resolve` ran the same checks: storage rejecting a declaration here is a defect
    const results = yield* storage.upsert(declarations).pipe(Effect.catchTag("ValidationError", Effect.die))
    const created = results.filter((r) => r.created).map((r) => r.name)
    const changed = results.filter((r) => r.changed).map((r) => r.name)
    if (created.length > 0) yield* Effect.logInfo(`cron schedules created: ${created.join(", ")}`)
    if (changed.length > 0) yield* Effect.logInfo(`cron schedules updated: ${changed.join(", ")}`)
    const stale = yield* storage.markStale(declarations.map((d) => d.name))
    if (stale.length > 0)
      yield* Effect.logWarning(
        `stale cron schedules (stored, not declared by this worker; they still fire until paused or removed): ${stale
          .map((s) => s.name)
          .join(", ")}`
      )
    return { results, stale }
  }).pipe(Effect.annotateLogs({ module: "Cron" }))

// -----------------------------------------------------------------------------------------------
// Evaluation (the leader's duty)

/** A schedule never fired, or whose expression or zone changed, looks back this far. */
export const lookbackMs = 60_000

/** Ticks at or before this are never due: the last fire, or one minute before the schedule (or its expression or zone) appeared. */
export const anchorOf = (
  schedule: Pick<CronStorage.CronScheduleState, "lastFireAt" | "scheduleChangedAt">
): number =>
  Math.max(
    schedule.lastFireAt?.getTime() ?? Number.NEGATIVE_INFINITY,
    schedule.scheduleChangedAt.getTime() - lookbackMs
  )

/** The ticks one evaluation at `now` fires for a schedule, in order. */
export const plan = (
  cron: Croner,
  schedule: Pick<CronStorage.CronScheduleState, "lastFireAt" | "scheduleChangedAt" | "missedFire">,
  now: number
): { readonly ticks: ReadonlyArray<number>; readonly more: boolean } => {
  // catch-up needs a previous fire: a new schedule does not backfill
  const max =
    schedule.missedFire._tag === "CatchUp" && schedule.lastFireAt !== null ? schedule.missedFire.max : 1
  return dueTicks(cron, anchorOf(schedule), now, max)
}

export interface FireReport {
  readonly name: string
  readonly tick: Date
  readonly result: CronStorage.FireResult
}

/**
 * Where a pass may stop when its caller is interrupted: before each fire. The leader runs a pass
 * uninterruptibly (`Leader.ts`, `every`: an interrupted statement is cancelled and rolled back),
 * so without this a worker's stop would wait for a whole catch-up (up to 1,000 fires a schedule).
 */
const betweenFires = Effect.interruptible(Effect.void)

/**
 * An evaluator: `evaluate(snapshot?)` runs one pass over every stored schedule (a fresh read
 * unless a snapshot is given) and fires what is due through `CronStorage.fire`. A schedule that
 * fails is logged and the pass goes on; one whose stored expression or zone cannot be evaluated
 * here is logged once and skipped.
 */
export const evaluator = () => {
  const warned = new Set<string>()
  // croner needs a time-zone conversion (about 0.5 ms) per step: remember parsed expressions and
  // each schedule's first tick after its anchor, so a pass over schedules not yet due costs none.
  const parsedCache = new Map<string, ReturnType<typeof parse>>()
  const nextDue = new Map<string, { readonly key: string; readonly next: number | undefined }>()
  const parseCached = (expression: string, timezone: string) => {
    const key = `${expression}\u0000${timezone}`
    let parsed = parsedCache.get(key)
    if (parsed === undefined) {
      if (parsedCache.size >= 1000) parsedCache.clear()
      parsed = parse(expression, timezone)
      parsedCache.set(key, parsed)
    }
    return parsed
  }
  const evaluateOne = (storage: CronStorageService, s: CronStorage.CronScheduleState, now: number) =>
    Effect.gen(function* () {
      const reports: Array<FireReport> = []
      const parsed = parseCached(s.expression, s.timezone)
      if (parsed._tag === "Invalid") {
        const key = `${s.name}\u0000${s.expression}\u0000${s.timezone}`
        if (!warned.has(key)) {
          if (warned.size >= 10_000) warned.clear()
          warned.add(key)
          yield* Effect.logWarning(`cron schedule ${s.name} cannot be evaluated: ${parsed.reason}`)
        }
        return reports
      }
      const anchor = anchorOf(s)
      const key = `${s.expression}\u0000${s.timezone}\u0000${anchor}`
      const known = nextDue.get(s.name)
      const next = known?.key === key ? known.next : nextTick(parsed.cron, anchor)
      if (nextDue.size >= 10_000) nextDue.clear()
      nextDue.set(s.name, { key, next })
      if (next === undefined || next > now) return reports
      const { ticks, more } = plan(parsed.cron, s, now)
      if (more && ticks.length > 0)
        yield* Effect.logInfo(
          s.missedFire._tag === "CatchUp" && s.lastFireAt !== null
            ? `cron schedule ${s.name}: more than ${s.missedFire.max} missed ticks; firing the latest ${ticks.length}`
            : `cron schedule ${s.name}: missed ticks coalesced into one fire at ${new Date(ticks.at(-1)!).toISOString()}`
        )
      let expected = s.lastFireAt
      for (const tick of ticks) {
        const at = new Date(tick)
        yield* betweenFires
        const result = yield* storage.fire(s.name, expected, at, CronStorage.toNewJob(s.job, at))
        reports.push({ name: s.name, tick: at, result })
        if (result._tag === "Skipped") {
          yield* Effect.logDebug(
            `cron schedule ${s.name}: tick ${at.toISOString()} skipped (${result.reason})`
          )
          break
        }
        yield* Effect.logDebug(`cron schedule ${s.name}: fired tick ${at.toISOString()}`)
        expected = at
      }
      return reports
    }).pipe(
      Effect.catchCause((cause) =>
        Effect.as(Effect.logWarning(`cron schedule ${s.name} failed to fire`, cause), [] as Array<FireReport>)
      )
    )

  return (snapshot?: CronStorage.CronSnapshot) =>
    Effect.gen(function* () {
      const storage = yield* CronStorage.CronStorage
      const { now, schedules } = snapshot ?? (yield* storage.list)
      const reports: Array<FireReport> = []
      for (const s of schedules) {
        if (s.paused) continue
        reports.push(...(yield* evaluateOne(storage, s, now.getTime())))
      }
      return reports as ReadonlyArray<FireReport>
    }).pipe(Effect.annotateLogs({ module: "Cron" }))
}

// -----------------------------------------------------------------------------------------------
// Reading and operating

export interface ScheduleInfo extends CronStorage.CronScheduleState {
  /** The next tick after now; null when paused, when it never fires again, or when invalid here. */
  readonly nextFireAt: Date | null
  /** A tick is due and not fired yet (the leader fires it within one evaluation interval). */
  readonly overdue: boolean
  /** Why the stored expression or zone cannot be evaluated by this process, if it cannot. */
  readonly invalid: string | null
}

/** Every stored schedule with its next fire time, in name order. */
export const list: Effect.Effect<
  ReadonlyArray<ScheduleInfo>,
  SqlError.SqlError,
  CronStorage.CronStorage
> = Effect.gen(function* () {
  const storage = yield* CronStorage.CronStorage
  const { now, schedules } = yield* storage.list
  return schedules.map((s): ScheduleInfo => {
    const parsed = parse(s.expression, s.timezone)
    if (parsed._tag === "Invalid") return { ...s, nextFireAt: null, overdue: false, invalid: parsed.reason }
    const next = s.paused ? undefined : nextTick(parsed.cron, now.getTime())
    const overdue = !s.paused && plan(parsed.cron, s, now.getTime()).ticks.length > 0
    return { ...s, nextFireAt: next === undefined ? null : new Date(next), overdue, invalid: null }
  })
})

/** Stops a schedule's fires (re-checked inside every fire) until `resume`. */
export const pause = (name: string, by?: string) =>
  Effect.flatMap(CronStorage.CronStorage, (storage) => storage.pause(name, by))

/** Resumes a schedule; ticks missed while paused follow its missed-fire policy. */
export const resume = (name: string) =>
  Effect.flatMap(CronStorage.CronStorage, (storage) => storage.resume(name))

/** Enqueues the schedule's job now, paused or not, without moving the schedule. */
export const trigger = (
  name: string
): Effect.Effect<
  EnqueuedJob,
  CronStorage.CronNotFound | ReadCommittedRequired | EnqueueError,
  CronStorage.CronStorage
> => Effect.flatMap(CronStorage.CronStorage, (storage) => storage.trigger(name))

/** Deletes a stored schedule (a worker still declaring it re-creates it when it starts). */
export const remove = (name: string) =>
  Effect.flatMap(CronStorage.CronStorage, (storage) => storage.remove(name))
