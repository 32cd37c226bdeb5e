/** Requests the orchestrator sends a system's child process, and what each answers. */
import type { Calls } from "../lib.ts"

export type Request =
  | { readonly op: "install" }
  | { readonly op: "describe" }
  | { readonly op: "enqueueSequential"; readonly from: number; readonly count: number }
  | { readonly op: "enqueueBatches"; readonly from: number; readonly count: number; readonly chunk: number }
  /**
   * 1 producer (one-at-a-time, each insert its own transaction) per `producers`, concurrently in
   * this process; producer p enqueues seqs from + p, from + p + producers, … on queue p mod `queues`.
   */
  | {
      readonly op: "enqueueConcurrent"
      readonly from: number
      readonly count: number
      readonly producers: number
      readonly queues: number
    }
  /** Starts the workers (`concurrency` in flight, default 50) if they are not running. */
  | { readonly op: "startWorkers"; readonly concurrency?: number | undefined }
  | { readonly op: "stopWorkers" }
  /** Starts the workers if they are not running, then waits for `expected` new executions and an empty queue. */
  | { readonly op: "runUntilDone"; readonly expected: number; readonly timeoutMs: number }
  /** Offers `rate` jobs/s for `seconds` (open loop) to running workers; waits for them all to start. */
  | {
      readonly op: "offer"
      readonly from: number
      readonly rate: number
      readonly seconds: number
      readonly timeoutMs: number
    }
  | {
      readonly op: "verify"
      readonly ranges: ReadonlyArray<{ readonly from: number; readonly count: number }>
    }
  | { readonly op: "openJobs" }
  /** Handler starts per seq of each range (for a check summed over processes), and in all. */
  | {
      readonly op: "executions"
      readonly ranges: ReadonlyArray<{ readonly from: number; readonly count: number }>
    }
  /** Handler starts in all. */
  | { readonly op: "total" }
  /** Completions acknowledged by storage in all (`SystemAdapter.completions`), or -1 without a count. */
  | { readonly op: "completions" }
  /** Soak: offers `rate` jobs/s for `seconds` (open loop); resolves once every insert returned. */
  | { readonly op: "produce"; readonly from: number; readonly rate: number; readonly seconds: number }
  /** Soak: counters, and pickup latency of the jobs started since the previous sample. */
  | { readonly op: "sample" }
  /** Waits until `total` handler starts in all and no open job. */
  | { readonly op: "settle"; readonly total: number; readonly timeoutMs: number }
  | { readonly op: "close" }

export interface Description {
  readonly name: string
  readonly version: string
  readonly settings: Readonly<Record<string, unknown>>
}

export interface Timed {
  readonly ms: number
  /** Per-call timings (one sample per enqueue call). */
  readonly calls?: Calls | undefined
}

export interface DrainTimes {
  /** From the call that starts the workers to the check that found no open job. */
  readonly ms: number
  /** From the call that starts the workers to the first handler start. */
  readonly firstStartMs: number
  /** From the call that starts the workers to the last expected handler start. */
  readonly lastStartMs: number
  /** Open-job polls after the last handler start until storage showed them all completed. */
  readonly settleMs: number
}

export interface Latencies {
  readonly offered: number
  readonly offerSeconds: number
  /** Handler start minus the producer's return from the committed insert, ms (may be < 0). */
  readonly pickup: {
    readonly p50: number
    readonly p95: number
    readonly p99: number
    readonly max: number
    readonly min: number
    readonly mean: number
  }
  /** Handler start minus the moment the insert was sent, ms. */
  readonly sendToStart: { readonly p50: number; readonly p99: number; readonly max: number }
  /** The producer's insert round trip, ms. */
  readonly insert: Calls
  /** How far behind its schedule the producer fell at worst, ms. */
  readonly maxScheduleLagMs: number
}

/** Answer to `executions`: `counts[r][i]` handler starts of seq `ranges[r].from + i`. */
export interface Executions {
  readonly counts: ReadonlyArray<ReadonlyArray<number>>
  readonly total: number
}

/** Exactly-once check of the seqs in the given ranges, plus handler starts of any other seq. */
export interface Verification {
  readonly expected: number
  readonly executedOnce: number
  readonly missing: number
  readonly duplicates: number
  readonly outside: number
}

export type Response = { readonly id: number } & (
  | { readonly ok: true; readonly value: unknown }
  | { readonly ok: false; readonly error: string }
)

export interface Sample {
  readonly offered: number
  readonly committed: number
  readonly insertErrors: number
  /** Handler starts in all (every run counted). */
  readonly executed: number
  /** Pickup latency (handler start minus insert commit) of the jobs first started since the last sample. */
  readonly pickup: {
    readonly count: number
    readonly p50: number
    readonly p99: number
    readonly max: number
  }
}
