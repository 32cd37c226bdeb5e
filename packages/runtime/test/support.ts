/** Helpers shared by the runtime tests. */
import { Effect, Schedule } from "effect"

/** Re-runs `check` until it returns true, or fails after `timeoutMs` (real time). */
export const eventually = <E, R>(
  check: Effect.Effect<boolean, E, R>,
  timeoutMs = 20_000,
  label = "condition"
) =>
  check.pipe(
    Effect.flatMap((ok) => (ok ? Effect.void : Effect.fail("not yet" as const))),
    Effect.retry(Schedule.spaced("25 millis")),
    Effect.timeoutOrElse({
      duration: timeoutMs,
      orElse: () => Effect.die(new Error(`${label} did not hold within ${timeoutMs} ms`))
    })
  )
