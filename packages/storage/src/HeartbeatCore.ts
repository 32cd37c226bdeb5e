/**
 * The heartbeat of one process's attempts, wherever it runs: on the handlers' event loop
 * (`Heartbeats.layerLoop`, the simulation) or on its own thread with its own connection
 * (`Heartbeats.layerThread`). It keeps the attempts the process holds, writes a heartbeat for
 * those held at least half an interval (shorter ones never write), carries progress that changed
 * since its last write, and reports attempts the database says are closed.
 *
 * **Guarantees** Writes are serialized (one round or flush at a time), so a progress value never
 * overwrites a newer one: each attempt's progress has a generation, a write carries the newest
 * known when it starts, and it acknowledges only that generation. Once `close` returns, no write
 * is in flight and none follows (the heartbeat thread outlives the worker session it served).
 */
import { Clock, Duration, Effect, Schedule, Semaphore } from "effect"
import type { SqlError } from "effect/sql"
import type { AttemptToken, HeartbeatItem, QueueStorage } from "./QueueStorage.ts"

/**
 * `heartbeatMany` outside any transaction. Heartbeats run on their own fibers (or thread), never
 * inside a caller's transaction, and the storage layer runs them at READ COMMITTED whatever the
 * pool's default (ReadCommitted.ts): a `ReadCommittedRequired` here is a bug, so a defect.
 */
export const heartbeatOutsideTransaction = (
  storage: QueueStorage["Service"],
  items: ReadonlyArray<HeartbeatItem>
): Effect.Effect<ReadonlyArray<AttemptToken>, SqlError.SqlError> =>
  Effect.catchTag(storage.heartbeatMany(items), "ReadCommittedRequired", (error) => Effect.die(error))

/** An attempt the process holds, from when its claim came back (`heldAt`, ms since the epoch). */
export interface TrackedAttempt extends AttemptToken {
  readonly heldAt: number
}

type Progress = Readonly<Record<string, unknown>>

interface Entry extends TrackedAttempt {
  progress: Progress | undefined
  generation: number
  written: number
}

export const keyOf = (token: AttemptToken) => `${token.jobId}:${token.runLease}`

/**
 * When rounds run: every `intervalMs` measured start to start. A round that takes longer (a slow
 * server, a reconnect) is followed by the next one at once, not an interval after it ends: with
 * `spaced` a 1.2 s round at a 300 ms interval left 1.5 s between an attempt's claim and its first
 * heartbeat, and the attempt was rescued (fault suite, scenario 2; ADR 0019).
 */
export const roundSchedule = (intervalMs: number) => Schedule.fixed(Duration.millis(intervalMs))

/**
 * A failed round (typically its connection was terminated or the server restarted) is tried
 * again at once: after 10 ms, doubling to at most 100 ms, for up to one interval; the next round
 * takes over after that. A lost connection is replaced on the first retry, so the heartbeat that
 * failed lands as soon as a connection is back rather than a whole interval later.
 */
export const retryRound = (intervalMs: number) =>
  Schedule.min([Schedule.exponential(Duration.millis(10)), Schedule.spaced(Duration.millis(100))]).pipe(
    Schedule.upTo({ duration: Duration.millis(intervalMs) })
  )

/** Attempts per heartbeat call (bounds the advisory locks one call holds). */
const chunkSize = 500

export const make = (storage: QueueStorage["Service"], intervalMs: number) => {
  const attempts = new Map<string, Entry>()
  const lock = Semaphore.makeUnsafe(1)
  let closed = false

  const track = (list: ReadonlyArray<TrackedAttempt>) => {
    if (closed) return
    for (const a of list) {
      const key = keyOf(a)
      if (!attempts.has(key))
        attempts.set(key, {
          jobId: a.jobId,
          runLease: a.runLease,
          heldAt: a.heldAt,
          progress: undefined,
          generation: 0,
          written: 0
        })
    }
  }

  const untrack = (key: string) => {
    attempts.delete(key)
  }

  /** Newer progress for an attempt; an older generation arriving late is ignored. */
  const setProgress = (key: string, progress: Progress, generation: number) => {
    const entry = attempts.get(key)
    if (entry !== undefined && generation > entry.generation) {
      entry.progress = progress
      entry.generation = generation
    }
  }

  const itemOf = (entry: Entry): HeartbeatItem =>
    entry.progress !== undefined && entry.generation > entry.written
      ? { jobId: entry.jobId, runLease: entry.runLease, progress: entry.progress }
      : { jobId: entry.jobId, runLease: entry.runLease }

  /**
   * One heartbeat round: every attempt held at least half an interval (the first heartbeat comes
   * within 1.5 intervals of the claim). Returns the attempts found closed, and stops tracking them.
   */
  const beat: Effect.Effect<ReadonlyArray<AttemptToken>, SqlError.SqlError> = lock.withPermit(
    Effect.gen(function* () {
      const now = yield* Clock.currentTimeMillis
      const due: Array<Entry> = []
      for (const entry of attempts.values()) if (now - entry.heldAt >= intervalMs / 2) due.push(entry)
      const closed: Array<AttemptToken> = []
      for (let i = 0; i < due.length; i += chunkSize) {
        const chunk = due.slice(i, i + chunkSize)
        const generations = chunk.map((e) => e.generation)
        const notOpen = yield* heartbeatOutsideTransaction(storage, chunk.map(itemOf))
        chunk.forEach((e, k) => {
          if (generations[k]! > e.written) e.written = generations[k]!
        })
        for (const token of notOpen) {
          attempts.delete(keyOf(token))
          closed.push(token)
        }
      }
      return closed
    })
  )

  /** Writes one attempt's progress now; a no-op write when the attempt is no longer open. */
  const flush = (token: AttemptToken, progress: Progress, generation: number) =>
    lock.withPermit(
      Effect.suspend(() => {
        if (closed) return Effect.void
        const key = keyOf(token)
        setProgress(key, progress, generation)
        return Effect.map(
          heartbeatOutsideTransaction(storage, [{ jobId: token.jobId, runLease: token.runLease, progress }]),
          () => {
            const entry = attempts.get(key)
            if (entry !== undefined && generation > entry.written) entry.written = generation
          }
        )
      })
    )

  /**
   * Forgets every attempt and stops writing: waits for the write in flight (the lock), after which
   * rounds find nothing due and flushes write nothing. Tracking what the session let go would
   * keep those attempts alive under the next session, however long it runs.
   */
  const close: Effect.Effect<void> = lock.withPermit(
    Effect.sync(() => {
      closed = true
      attempts.clear()
    })
  )

  return { track, untrack, setProgress, beat, flush, close, size: () => attempts.size }
}

export type HeartbeatCore = ReturnType<typeof make>
