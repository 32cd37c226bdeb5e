/**
 * Job kinds and worker configuration shared by the fault suite (`faults.test.ts`, the producer)
 * and its worker processes (`worker-process.ts`, the consumers).
 *
 * Every handler records each execution durably before doing anything else: one row
 * `(job_id, run_lease, attempt, kind, worker, pid, event = 'start')` in the plain table
 * `fault_log` of the scenario's database. That table, not the queue, is how the suite counts
 * executions, duplicates and lost jobs.
 */
import { Job } from "@awa/core"
import { Schema } from "effect"

/** DDL of the execution log; created by the suite in each scenario's database. */
export const faultLogDdl = `
  CREATE TABLE IF NOT EXISTS fault_log (
    id bigserial PRIMARY KEY,
    job_id bigint NOT NULL,
    run_lease bigint NOT NULL,
    attempt int NOT NULL,
    kind text NOT NULL,
    worker text NOT NULL,
    pid int NOT NULL,
    event text NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
  )`

/** Handler-requested retries wait 100 ms (rescues use the storage's default backoff). */
const quick = () => 100

// --- ordinary work ---------------------------------------------------------------------------

/** Sleeps `ms`, then completes. */
export const Work = Job.define({ kind: "work", args: Schema.Struct({ ms: Schema.Number }), backoff: quick })

/**
 * Runs until the suite releases it (`release` rows in `fault_log`, see the harness), then
 * completes: an attempt that is alive for as long as a scenario needs, whatever the machine's
 * speed. `maxMs` only ends it if the suite never does (a failed run).
 */
export const Held = Job.define({ kind: "held", args: Schema.Struct({ maxMs: Schema.Number }) })

// --- misbehaving handlers (scenario 5), Effect API --------------------------------------------

const N = Schema.Struct({ n: Schema.Number })

/** Throws inside `Effect.sync` (a defect). */
export const Throws = Job.define({ kind: "throws", args: N, backoff: quick })
/** Throws before returning an Effect at all. */
export const ThrowsOutside = Job.define({ kind: "throws_outside", args: N, backoff: quick })
/** Fails with a typed, retryable error. */
export const Fails = Job.define({ kind: "fails", args: N, backoff: quick })
/** Returns a defect (`Effect.die`). */
export const Dies = Job.define({ kind: "dies", args: N, backoff: quick })
/** Fails terminally (`JobTerminalError`). */
export const Terminal = Job.define({ kind: "terminal", args: N, backoff: quick })
/** Hangs on its first attempt (past the queue's deadline), completes on the second. */
export const HangOnce = Job.define({ kind: "hang_once", args: N, backoff: quick })
/** Hangs on every attempt. */
export const HangAlways = Job.define({ kind: "hang_always", args: N, backoff: quick })
/** First attempt ignores interruption (uninterruptible sleep of `ms`), second completes. */
export const Uninterruptible = Job.define({
  kind: "uninterruptible",
  args: Schema.Struct({ ms: Schema.Number }),
  backoff: quick
})
/** Blocks the event loop (busy wait) for `ms`, then completes. */
export const BlockLoop = Job.define({
  kind: "block_loop",
  args: Schema.Struct({ ms: Schema.Number }),
  backoff: quick
})

// --- misbehaving handlers (scenario 5), Promise facade -----------------------------------------

/** Returns a rejected promise. */
export const PromiseRejects = Job.define({ kind: "p_rejects", args: N, backoff: quick })
/** Throws synchronously instead of returning a promise. */
export const PromiseThrowsSync = Job.define({ kind: "p_throws_sync", args: N, backoff: quick })
/** Rejects with `JobTerminalError`. */
export const PromiseTerminal = Job.define({ kind: "p_terminal", args: N, backoff: quick })
/** First attempt ignores its AbortSignal and keeps running for `ms`; the second completes. */
export const PromiseIgnoresAbort = Job.define({
  kind: "p_ignores_abort",
  args: Schema.Struct({ ms: Schema.Number }),
  backoff: quick
})
/** Completes. */
export const PromiseOk = Job.define({ kind: "p_ok", args: N, backoff: quick })

// --- bad input (scenario 6) ------------------------------------------------------------------

/** Fails its first attempt; its backoff asks for a fractional delay (1.5 ms). */
export const BadBackoff = Job.define({ kind: "bad_backoff", args: N, backoff: () => 1.5 })
/** Fails its first attempt; its backoff function throws. */
export const ThrowingBackoff = Job.define({
  kind: "throwing_backoff",
  args: N,
  backoff: () => {
    throw new Error("backoff exploded")
  }
})
/** First attempt returns an invalid outcome (negative, too long or unparseable delay, `null`); then completes. */
export const BadResult = Job.define({
  kind: "bad_result",
  args: Schema.Struct({ variant: Schema.Literals(["negative_retry", "huge_snooze", "unparseable", "null"]) }),
  backoff: quick
})

/** Strings shaped like SQL injection: stored verbatim, harmless. */
export const injection = {
  queue: `q'); DROP TABLE fault_log; --`,
  kind: `k"; DELETE FROM awa.queue_meta; SELECT '1`,
  tags: [`t' OR '1'='1`, "$$; TRUNCATE fault_log; $$", `\\'); --`],
  metadata: { "note'); DROP SCHEMA awa CASCADE; --": `v"; SELECT pg_sleep(10); --`, nested: { a: "'--" } }
} as const

export const Injected = Job.define({ kind: injection.kind, args: Schema.Struct({ s: Schema.String }) })

// --- stale writers (scenario 7) --------------------------------------------------------------

/**
 * Attempt 1 sleeps `firstMs`; later attempts run until the suite releases the job (at most
 * `maxMs`). Both record `start` and `end`.
 */
export const StaleWriter = Job.define({
  kind: "stale_writer",
  args: Schema.Struct({ firstMs: Schema.Number, maxMs: Schema.Number })
})

// --- key-execution grants (keyGrants.test.ts) -------------------------------------------------

/**
 * Records `start` with its key in `key_log`, sleeps `ms`, records `end`, completes: the suite
 * checks from `key_log` that no key ever ran more than its policy allows.
 */
export const Keyed = Job.define({
  kind: "keyed",
  args: Schema.Struct({ key: Schema.String, ms: Schema.Number })
})

/** DDL of the key-grant execution log; created by `keyGrants.test.ts`. */
export const keyLogDdl = `
  CREATE TABLE IF NOT EXISTS key_log (
    id bigserial PRIMARY KEY,
    job_id bigint NOT NULL,
    run_lease bigint NOT NULL,
    key text NOT NULL,
    worker text NOT NULL,
    event text NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
  )`

// --- worker configuration --------------------------------------------------------------------

/** What `worker-process.ts` reads from `AWA_FAULT_WORKER` (durations in milliseconds). */
export interface WorkerConfig {
  readonly name: string
  /** Effect API handlers (default) or the Promise facade's. */
  readonly facade?: "effect" | "promise" | undefined
  readonly maxConnections?: number | undefined
  /** `WorkerOptions` without `handlers`; passed through unchecked, so it can be invalid on purpose. */
  readonly options: Record<string, unknown>
  /** HTTP-worker kinds this worker also runs (callback scenarios): `Awa.httpWorker(kind, options)`. */
  readonly http?:
    | ReadonlyArray<{ readonly kind: string; readonly options: Record<string, unknown> }>
    | undefined
}

/** A line `worker-process.ts` prints for the suite: `@@fault {json}`. */
export const eventPrefix = "@@fault "
