/**
 * The heartbeat of one process's attempts, wherever it runs: on the handlers' event loop
 * (`Heartbeats.layerLoop`, the simulation) or on its own thread with its own connection
 * (`Heartbeats.layerThread`). It reads the attempts the process holds from their table
 * (`AttemptTable`, shared memory the main thread writes), writes a heartbeat for those held at
 * least half an interval (shorter ones never write), carries progress that changed since its last
 * write, and reports attempts the database says are closed.
 *
 * **Guarantees** Writes are serialized (one round or flush at a time), so a progress value never
 * overwrites a newer one: each attempt's progress has a generation, a write carries the newest
 * known when it starts, and it acknowledges only that generation. Once `close` returns, no write
 * is in flight and none follows (the heartbeat thread outlives the worker session it served).
 */
import { Clock, Duration, Effect, Schedule, Semaphore } from "effect"
import type { SqlError } from "effect/sql"
import type * as AttemptTable from "./AttemptTable.ts"
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

type Progress = Readonly<Record<string, unknown>>

/** An attempt's progress not yet written, or written up to `written` (generations). */
interface ProgressEntry {
  progress: Progress
  generation: number
  written: number
}

/** A due attempt of a round: its handle in the table and its token. */
interface Due extends AttemptToken {
  readonly handle: number
}

const keyOf = (token: AttemptToken) => `${token.jobId}:${token.runLease}`

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

/**
 * The heartbeats of the attempts in `attempts` (an `AttemptTable`, or a reader of one another
 * thread writes). Progress is told per handle; an attempt's progress is forgotten once it is no
 * longer held.
 */
export const make = (
  storage: QueueStorage["Service"],
  intervalMs: number,
  attempts: AttemptTable.AttemptReader
) => {
  const progress = new Map<number, ProgressEntry>()
  // attempts a round found closed: not heartbeated again while they are held
  const found = new Set<number>()
  const lock = Semaphore.makeUnsafe(1)
  let closed = false

  /** Newer progress for a held attempt; an older generation arriving late is ignored. */
  const setProgress = (handle: number, value: Progress, generation: number) => {
    if (closed || !attempts.isHeld(handle)) return
    const entry = progress.get(handle)
    if (entry === undefined) progress.set(handle, { progress: value, generation, written: 0 })
    else if (generation > entry.generation) {
      entry.progress = value
      entry.generation = generation
    }
  }

  const itemOf = (due: Due): HeartbeatItem => {
    const entry = progress.get(due.handle)
    return entry !== undefined && entry.generation > entry.written
      ? { jobId: due.jobId, runLease: due.runLease, progress: entry.progress }
      : { jobId: due.jobId, runLease: due.runLease }
  }

  /** Forgets the progress and findings of attempts let go since the last round. */
  const sweep = () => {
    for (const handle of progress.keys()) if (!attempts.isHeld(handle)) progress.delete(handle)
    for (const handle of found) if (!attempts.isHeld(handle)) found.delete(handle)
  }

  /**
   * One heartbeat round: every attempt held at least half an interval (the first heartbeat comes
   * within 1.5 intervals of the claim). Returns the attempts found closed; they are not
   * heartbeated again.
   */
  const beat: Effect.Effect<ReadonlyArray<AttemptToken>, SqlError.SqlError> = lock.withPermit(
    Effect.gen(function* () {
      if (closed) return []
      const now = yield* Clock.currentTimeMillis
      sweep()
      const due: Array<Due> = []
      attempts.forEachHeld((handle, jobId, runLease, heldAt) => {
        if (now - heldAt >= intervalMs / 2 && !found.has(handle)) due.push({ handle, jobId, runLease })
      })
      const closedNow: Array<AttemptToken> = []
      for (let i = 0; i < due.length; i += chunkSize) {
        const chunk = due.slice(i, i + chunkSize)
        const generations = chunk.map((d) => progress.get(d.handle)?.generation ?? 0)
        const notOpen = yield* heartbeatOutsideTransaction(storage, chunk.map(itemOf))
        chunk.forEach((d, k) => {
          const entry = progress.get(d.handle)
          if (entry !== undefined && generations[k]! > entry.written) entry.written = generations[k]!
        })
        if (notOpen.length === 0) continue
        const byKey = new Map(chunk.map((d) => [keyOf(d), d.handle]))
        for (const token of notOpen) {
          const handle = byKey.get(keyOf(token))
          if (handle !== undefined) found.add(handle)
          closedNow.push(token)
        }
      }
      return closedNow
    })
  )

  /** Writes one held attempt's progress now; a no-op once it is let go or closed. */
  const flush = (handle: number, value: Progress, generation: number) =>
    lock.withPermit(
      Effect.suspend(() => {
        const token = attempts.tokenOf(handle)
        if (closed || token === undefined) return Effect.void
        setProgress(handle, value, generation)
        return Effect.map(
          heartbeatOutsideTransaction(storage, [
            { jobId: token.jobId, runLease: token.runLease, progress: value }
          ]),
          () => {
            const entry = progress.get(handle)
            if (entry !== undefined && generation > entry.written) entry.written = generation
          }
        )
      })
    )

  /**
   * Stops writing: waits for the write in flight (the lock), after which rounds and flushes write
   * nothing. Heartbeating what the session let go would keep those attempts alive under the next
   * session, however long it runs.
   */
  const close: Effect.Effect<void> = lock.withPermit(
    Effect.sync(() => {
      closed = true
      progress.clear()
      found.clear()
    })
  )

  return { setProgress, beat, flush, close }
}

export type HeartbeatCore = ReturnType<typeof make>
