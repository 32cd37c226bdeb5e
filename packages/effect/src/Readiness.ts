/**
 * What the admin server's `/readyz` knows beyond the database (issue 18 item 3;
 * docs/adr/0024-operator-surface.md, "Amendment 2026-12-02"): whether this process holds a
 * LISTEN on the schema's channels, and whether it is shutting down.
 *
 * **LISTEN connected** `layer` subscribes to `StorageSignals` (the same LISTENs a worker makes, on
 * one pooled connection of its own) and re-subscribes after a loss; it reports `listening` from
 * Postgres's confirmation of both LISTENs until the stream ends. It is the admin process's own
 * listener: a worker in the same process holds another one, which its dispatchers watch (they
 * poll while it is down), so readiness answers "can this process receive notifications from this
 * database", for a server with or without a worker.
 *
 * **Shutting down** `beginShutdown` flips `/readyz` to 503 at once while the server keeps
 * answering, so an orchestrator stops routing to it before it goes (`awa serve` calls it on
 * SIGTERM/SIGINT, then waits its `--shutdown-grace`); closing the layer's scope flips it too.
 */
import { StorageSignals } from "@awa/storage"
import { Context, Effect, Layer, Schedule, Stream } from "effect"

export interface ReadinessState {
  readonly listening: boolean
  readonly shuttingDown: boolean
}

export class Readiness extends Context.Service<
  Readiness,
  {
    readonly state: Effect.Effect<ReadinessState>
    readonly beginShutdown: Effect.Effect<void>
  }
>()("@awa/effect/Readiness") {}

/** Readiness with a listener of its own on `StorageSignals`; needs a `StorageSignals` layer. */
export const layer: Layer.Layer<Readiness, never, StorageSignals.StorageSignals> = Layer.effect(
  Readiness,
  Effect.gen(function* () {
    const signals = yield* StorageSignals.StorageSignals
    let listening = false
    let shuttingDown = false
    yield* signals.signals.pipe(
      Stream.runForEach((signal) =>
        Effect.sync(() => {
          if (signal._tag === "Subscribed") listening = true
        })
      ),
      // the stream ends (or fails) when the listening connection is lost: not listening until
      // the next subscription is confirmed
      Effect.ensuring(Effect.sync(() => (listening = false))),
      Effect.ignore,
      Effect.repeat(Schedule.spaced("1 second")),
      Effect.forkScoped
    )
    yield* Effect.addFinalizer(() => Effect.sync(() => (shuttingDown = true)))
    return {
      state: Effect.sync(() => ({ listening, shuttingDown })),
      beginShutdown: Effect.sync(() => {
        shuttingDown = true
      })
    }
  })
)
