import { existsSync, readFileSync } from "node:fs"
import { dirname, join } from "node:path"
import { fileURLToPath } from "node:url"

/**
 * What the comparison needs from a queue system. One adapter per system; each runs in its own
 * Node child process (`compare/child.ts`) against its own database. Jobs carry `{ seq }` only and
 * all go to one queue (or task identifier) named `bench`.
 */

export type SystemName = "awa" | "graphile-worker" | "pg-boss"

export const systemNames: ReadonlyArray<SystemName> = ["awa", "graphile-worker", "pg-boss"]

/** Jobs in flight per system: the same for everyone (split over the processes of the scale phase). */
export const inFlight = 50

/** The queue every phase uses; the multi-queue producers phase adds `bench_1` … `bench_7`. */
export const benchQueue = "bench"

/** Queue `i` of `queueCount` (i = 0 is `bench`); jobs of every such queue count as the system's. */
export const queueName = (i: number) => (i === 0 ? benchQueue : `${benchQueue}_${i}`)

/** Queues the multi-queue producers phase spreads its jobs over (installed up front where needed). */
export const queueCount = 8

/**
 * How Awa is configured (issue 17): `tuned` is the comparison's long-standing setting (tracing
 * off, see `awa.ts`); `defaults` is what `Awa.layerPg` + `Awa.worker` give with only
 * `maxConcurrency` set; `lean` is `tuned` keeping no completed job (`completedRetention: 0`), which
 * is what graphile-worker does (it deletes a job when it completes). The peers have one
 * configuration each.
 */
export type Profile = "tuned" | "defaults" | "lean"

export const profiles: ReadonlyArray<Profile> = ["tuned", "defaults", "lean"]

/** The profiles a run uses when `--profile` is not given (`lean` only on request). */
export const defaultProfiles: ReadonlyArray<Profile> = ["tuned", "defaults"]

export interface AdapterOptions {
  readonly profile: Profile
}

export interface SystemAdapter {
  readonly name: SystemName
  /** The package version actually loaded. */
  readonly version: string
  /** Every setting that differs from the system's defaults, and the relevant defaults kept. */
  readonly settings: Readonly<Record<string, unknown>>
  /** Installs the schema and the `bench` queue (run once, on the template database). */
  readonly install: () => Promise<void>
  /** Enqueues one job per seq, one call (and one transaction) each, waiting for each. */
  readonly enqueueSequential: (seqs: ReadonlyArray<number>) => Promise<void>
  /** Enqueues one job in its own transaction (on `queue`, default `bench`); resolves once committed. */
  readonly enqueueOne: (seq: number, queue?: string) => Promise<void>
  /** Enqueues all of `seqs` in one call (the system's batch API). */
  readonly enqueueBatch: (seqs: ReadonlyArray<number>) => Promise<void>
  /**
   * Starts workers with `concurrency` (default `inFlight`) jobs in flight on the `bench` queue;
   * the no-op handler calls `onStart(seq)` first thing. Resolves once the workers are started.
   */
  readonly startWorkers: (onStart: (seq: number) => void, concurrency?: number) => Promise<void>
  /** Stops the workers cleanly (in-flight handlers finish, completions are flushed). */
  readonly stopWorkers: () => Promise<void>
  /** Jobs of the `bench` queues (`queueName`) that are not completed (queued, running, retrying or failed). */
  readonly openJobs: () => Promise<number>
  /**
   * Attempts this process's workers completed whose completion storage has acknowledged (the
   * system's own count, read in process). Where a system has one, the drain's timed interval
   * ends when it reaches the backlog, and `openJobs` (exact, but a query over storage that may
   * cost more than the settle it measures) runs after the interval, for correctness only.
   */
  readonly completions?: () => number
  readonly close: () => Promise<void>
}

export type AdapterFactory = (url: string, options?: AdapterOptions) => Promise<SystemAdapter>

/** The version of an installed package (found from its entry point; `package.json` may not be exported). */
export const packageVersion = (name: string): string => {
  let dir = dirname(fileURLToPath(import.meta.resolve(name)))
  for (;;) {
    const file = join(dir, "package.json")
    if (existsSync(file)) {
      const pkg = JSON.parse(readFileSync(file, "utf8")) as { name?: string; version?: string }
      if (pkg.name === name) return pkg.version ?? "unknown"
    }
    const parent = dirname(dir)
    if (parent === dir) return "unknown"
    dir = parent
  }
}
