/**
 * Handlers: the Effect that processes one job kind. `R` comes from the application's own layers.
 */
import type { Job } from "@awa/core"
import type { ErrorEntry } from "@awa/storage"
import type { Effect } from "effect"

/** What a handler sees of its job and attempt. */
export interface JobContext {
  readonly job: {
    readonly id: bigint
    readonly kind: string
    readonly queue: string
    readonly attempt: number
    readonly maxAttempts: number
    readonly runLease: bigint
    readonly metadata: Readonly<Record<string, unknown>>
    readonly tags: ReadonlyArray<string>
    readonly errors: ReadonlyArray<ErrorEntry>
  }
  /** Aborted when the attempt is interrupted (cancel, rescue, deadline, shutdown). */
  readonly signal: AbortSignal
  /** Records a progress snapshot (a JSON object), written with the next heartbeat. */
  readonly setProgress: (progress: Readonly<Record<string, unknown>>) => Effect.Effect<void>
}

export interface Handler<R = never> {
  readonly definition: Job.JobDefinition<any, any>
  readonly run: (args: unknown, ctx: JobContext) => Effect.Effect<Job.JobResult | void, unknown, R>
}

/** Binds a handler to a job definition; `args` arrive decoded by the definition's Schema. */
export const handler = <A, I, E, R>(
  definition: Job.JobDefinition<A, I>,
  run: (args: A, ctx: JobContext) => Effect.Effect<Job.JobResult | void, E, R>
): Handler<R> => ({ definition, run: run as Handler<R>["run"] })
