/** Helpers shared by the runtime tests. */
import { Effect, Schedule, Tracer } from "effect"
import { TestClock } from "effect/testing"

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

/** A tracer that records every span it creates, like an in-memory exporter. */
export const recordingTracer = () => {
  const spans: Array<Tracer.NativeSpan> = []
  const tracer = Tracer.make({
    span: (options) => {
      const span = new Tracer.NativeSpan(options)
      spans.push(span)
      return span
    }
  })
  return { spans, tracer }
}

/** Moves virtual time forward in small steps, letting every fiber run between steps. */
export const advance = (ms: number, stepMs = 10) =>
  Effect.gen(function* () {
    for (let t = 0; t < ms; t += stepMs) {
      yield* TestClock.adjust(Math.min(stepMs, ms - t))
      for (let i = 0; i < 5; i++) yield* Effect.yieldNow
    }
  })
