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

/** Jobs in flight per system: the same for everyone. */
export const inFlight = 50

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
  /** Enqueues one job in its own transaction; resolves once it is committed. */
  readonly enqueueOne: (seq: number) => Promise<void>
  /** Enqueues all of `seqs` in one call (the system's batch API). */
  readonly enqueueBatch: (seqs: ReadonlyArray<number>) => Promise<void>
  /**
   * Starts workers with `inFlight` jobs in flight; the no-op handler calls `onStart(seq)` first
   * thing. Resolves once the workers are started.
   */
  readonly startWorkers: (onStart: (seq: number) => void) => Promise<void>
  /** Stops the workers cleanly (in-flight handlers finish, completions are flushed). */
  readonly stopWorkers: () => Promise<void>
  /** Jobs of the `bench` queue that are not completed (queued, running, retrying or failed). */
  readonly openJobs: () => Promise<number>
  readonly close: () => Promise<void>
}

export type AdapterFactory = (url: string) => Promise<SystemAdapter>

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
