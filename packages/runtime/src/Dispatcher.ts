/**
 * One dispatcher per queue: claims jobs, holds them in a local buffer, and starts each on the
 * executor as capacity frees up. It sleeps until a wake-up (LISTEN/NOTIFY), freed capacity, or
 * the poll interval.
 *
 * **Idle polling** While the worker's listener is subscribed, every enqueue, promotion, retry and
 * resume of this queue rings the doorbell, so the poll is only a fallback for a lost wake-up: each
 * claim that finds nothing doubles the wait, from `pollIntervalMs` up to `idlePollMaxMs`, with
 * ±20 % jitter so a thousand idle queues do not poll in step. A claim that finds work, or a
 * wake-up, resets it. Without a listener (notifications off, or lost until it re-subscribes, when
 * every dispatcher is woken) the wait stays at `pollIntervalMs`. So a job is picked up at once on
 * a wake-up, and within `idlePollMaxMs × 1.2` (plus one claim) if its wake-up is lost
 * (docs/adr/0016-dlq-retry-unique-masks-idle-dispatch.md).
 *
 * **Wake-ups on demand** (docs/adr/0038-wake-ups-on-demand.md) An insert sends its queue's
 * wake-up only while a worker says it waits for one. So before it waits, a dispatcher says so
 * (`WakeSource.waitFor`); having just said so, it claims once more first (an insert committed
 * before may have sent none), and an insert still in flight that sent none makes it claim again
 * shortly instead. Two full claims in a row (a backlog) make it stop waiting, so that inserts
 * skip their wake-ups while it claims anyway.
 *
 * **Claiming ahead** A claim round trip costs about as much for 500 jobs as for 50, so claiming
 * only the free capacity caps a busy queue at `maxConcurrency` jobs per round trip, and leaves the
 * handlers idle while each claim is in flight. The dispatcher therefore claims up to `prefetch`
 * jobs beyond the free capacity, sized to what the queue actually gets through in about two
 * claim round trips (a measured rate, so slow handlers get next to nothing buffered), and claims
 * the next batch while the buffer still feeds the handlers. A buffered job is a claimed attempt:
 * it is heartbeated and cancellable from the moment it is held, and its deadline counts from the
 * claim (docs/adr/0011-claim-ahead.md).
 *
 * **Flow control** (docs/adr/0028-flow-control.md) A claim takes at most `claimBatchSize` jobs,
 * at most the whole tokens of the queue's rate limiter (refunded when the claim returns fewer),
 * and, in weighted mode, at most the permits it got from the pool, which it takes before the
 * claim and gives back in the claim's release step (interruption and defects included) unless
 * a claimed job now holds them; each job gives its permit back when its handler is done or it
 * is given back unstarted. Poll interval, batch size, deadline and rate are read on every claim
 * from the queue's live settings, which hot overrides change.
 *
 * **Closure wake-ups** (keyed queues, docs/adr/0029-key-execution-grants.md) A worker's
 * finalization of keyed attempts sends `Closed` for their key policy: a grant may be free for a
 * claimer of any queue under it that stopped at a key at its limit. It reaches this process's
 * dispatchers of those queues in memory, and every process's while a claimer has announced that it
 * waits (a gated claim announces, at most once a second, and claims once more:
 * docs/adr/0037-closure-announcements-on-demand.md). Rung only when that can be this one: the last
 * claim found keys at their limit (taking nothing, or stopping short at one: migration 0041 says
 * so), or took a full batch. A dispatcher whose last claim took all it found ignores it (a
 * closure adds no claimable job; new work comes with its own wake-up), so neither one process
 * nor a fleet's idle ones claim once per burst of closures. One that arrives while a claim is in
 * flight is noted and answered by that claim's result: the dispatcher claims again at once only
 * if the claim stopped at a key at its limit (whose grant the closure may have freed after the
 * claim's snapshot); a claim that took all it found, or took a full batch, needs nothing more.
 *
 * **Guarantees** Never more than `maxConcurrency` handlers at once; never more than `prefetch`
 * jobs waiting; jobs start in claim order (FIFO per lane is kept). A claim error is logged and
 * retried after the poll interval (the dispatcher never dies on a database error). On `stop`,
 * jobs still waiting are given back (snoozed with no delay) instead of starting.
 */
import { CallbackStorage, type FlowStorage, type StorageSignals } from "@awa/storage"
import { Clock, Effect, type FiberSet, Option, Queue, Random } from "effect"
import type { QueueShare } from "./ConcurrencyPermits.ts"
import type { Executor, RunningAttempt } from "./Executor.ts"
import type * as FlowMetrics from "./FlowMetrics.ts"
import * as KeyedDispatch from "./KeyedDispatch.ts"
import type { LiveSettings } from "./QueueOverrides.ts"

export interface DispatcherConfig {
  readonly queue: string
  readonly maxConcurrency: number
  /** Most claimed jobs waiting here for capacity; 0 = claim only free capacity. */
  readonly prefetch: number
  readonly pollIntervalMs: number
  /** Longest idle poll interval while wake-ups are being received (≥ `pollIntervalMs`). */
  readonly idlePollMaxMs: number
  readonly deadlineMs: number
  readonly agingIntervalMs: number
  /** Trace claims (span `awa.claim <queue>`); off: the claim emits no span at all. */
  readonly backgroundSpans: boolean
  /** Claim through this key policy (capabilities.md §23 tier 2; KeyedDispatch.ts). */
  readonly keyPolicy?: string | undefined
  /** Claim within this fleet-wide rate (FlowStorage.claimRated, docs/adr/0036-fleet-rate-limit.md). */
  readonly fleetRate?: FlowStorage.FleetRate | undefined
  /** At most this many running attempts per concurrency key in this process (tier 1). */
  readonly localKeyLimit?: number | undefined
}

/** Longest wait for more capacity before claiming into a small free slot count. */
const claimLingerMs = 2
/** The buffer aims to cover this many claim round trips of work. */
const lookaheadRoundTrips = 2
/** Fallback period of the look for resumed parked attempts (a notification normally rings first). */
const resumeCheckMs = 30_000
/** Weight of the newest sample in the moving averages of rate and claim latency. */
const smoothing = 0.3

export interface Dispatcher<R> {
  /** Rings the doorbell: something may be claimable now. */
  readonly wake: Effect.Effect<void>
  /**
   * Keyed attempts of this queue closed: rings the doorbell unless the last claim left nothing
   * claimable behind (found nothing, or took all it found). With a claim in flight, noted for
   * its result: claim again at once if it stopped at a key at its limit.
   */
  readonly closed: Effect.Effect<void>
  /** A parked attempt of this queue was resumed: take it back (`claimResumed`) on the next round. */
  readonly resumed: Effect.Effect<void>
  /** The loop; runs until interrupted. */
  readonly loop: Effect.Effect<never, never, R>
  /** Stops starting buffered jobs and gives them back. Call after interrupting `loop`. */
  readonly stop: Effect.Effect<void>
}

/** Wake-ups: whether they are being received now, and saying which queues wait for them. */
export interface WakeSource {
  /** The worker's listener is subscribed. */
  readonly listening: () => boolean
  /**
   * This queue's dispatcher is about to wait for a wake-up: inserts must send it one (migration
   * 0051, docs/adr/0038-wake-ups-on-demand.md; `StorageSignals.Waiters`).
   */
  readonly waitFor: (queue: string) => Effect.Effect<StorageSignals.Waiting>
  /** This queue's dispatcher claims from a backlog: inserts may skip its wake-ups. */
  readonly stopWaiting: (queue: string) => Effect.Effect<void>
}

const alwaysPoll: WakeSource = {
  listening: () => false,
  waitFor: () => Effect.succeed("Unavailable"),
  stopWaiting: () => Effect.void
}

/** Flow control of one queue (all optional: absent, the dispatcher claims as before). */
export interface DispatcherFlow {
  /** Settings hot overrides change; default: the config's values, no rate limit. */
  readonly live?: LiveSettings | undefined
  /** This queue's share of the weighted pool; absent in hard-reserved mode. */
  readonly permits?: QueueShare | undefined
  readonly metrics?: FlowMetrics.FlowRecorder | undefined
  /**
   * Keyed queues (ADR 0037): announces that a claim stopped at a key at its limit, so that
   * closures under the queue's key policy are announced to this process; true when it announced
   * just now (then the dispatcher claims once more). Absent: never announced.
   */
  readonly announceGated?: Effect.Effect<boolean> | undefined
}

/** Jitter of the idle poll: the wait is scaled by a factor in [1 − j, 1 + j). */
const idleJitter = 0.2

export const make = Effect.fnUntraced(function* <R>(
  config: DispatcherConfig,
  fibers: FiberSet.FiberSet<unknown, unknown>,
  executor: Executor<R>,
  wakes: WakeSource = alwaysPoll,
  flow: DispatcherFlow = {}
) {
  const callbacks = Option.getOrUndefined(yield* Effect.serviceOption(CallbackStorage))
  // Resumed parked attempts (capabilities.md §17): taken back when a notification says so, and
  // every resumeCheckMs in case it was lost (well inside the stale sweep's 90 s, which would
  // otherwise retry them without their payload).
  let resumeWanted = true
  let lastResumeCheck = 0
  const localKeys =
    config.localKeyLimit === undefined ? undefined : KeyedDispatch.makeLocalKeyGate(config.localKeyLimit)
  const live: LiveSettings = flow.live ?? {
    pollIntervalMs: config.pollIntervalMs,
    claimBatchSize: undefined,
    deadlineMs: config.deadlineMs,
    limiter: undefined,
    fleetRate: config.fleetRate
  }
  // a rated queue's claims apply the fleet rate in force (a hot override retunes it, never removes it)
  const configuredRate = config.fleetRate
  const claimBatch = yield* KeyedDispatch.claimer(
    config.queue,
    config.keyPolicy,
    configuredRate === undefined ? undefined : () => live.fleetRate ?? configuredRate
  )
  const permits = flow.permits
  const metrics = flow.metrics
  /** A job this dispatcher claimed is done with (finished or given back): its permit goes back. */
  const releasePermits = (n: number) => (permits === undefined || n <= 0 ? Effect.void : permits.release(n))
  // Plain mutable state: every reader and writer runs on the JS thread between fiber yields, and
  // a Ref per started job was measurable per-job cost in the drain profile.
  let inFlight = 0
  let stopping = false
  const buffer: Array<RunningAttempt> = []
  let head = 0
  const bufferedCount = () => buffer.length - head + (localKeys?.held() ?? 0)

  // Throughput (jobs finished per ms) and claim latency, as moving averages.
  let finished = 0
  let finishedAtLastClaim = 0
  let lastClaimAt: number | undefined
  let rate = 0
  let claimLatencyMs = 1

  // Closure wake-ups: ignored while the last claim left nothing claimable behind; one during a
  // claim is noted for that claim's result.
  let claiming = false
  let closedWhileClaiming = false
  let nothingLeft = false
  /** The claim's result is judged: closures ring or not by `nothingLeft` again. Noted ones? */
  const endClaim = () => {
    claiming = false
    const noted = closedWhileClaiming
    closedWhileClaiming = false
    return noted
  }

  // Sliding queues of capacity 1: repeated rings while busy collapse into one.
  const wakeBell = yield* Queue.sliding<void>(1)
  const capacityBell = yield* Queue.sliding<void>(1)
  const ring = (bell: Queue.Queue<void>) => Effect.asVoid(Queue.offer(bell, undefined))

  /** How many jobs to keep waiting here: about two claim round trips of work, at most `prefetch`. */
  const prefetchTarget = () =>
    config.prefetch === 0
      ? 0
      : Math.min(config.prefetch, Math.ceil(rate * claimLatencyMs * lookaheadRoundTrips))

  const takeNext = (): RunningAttempt | undefined => {
    if (head === buffer.length) return undefined
    const entry = buffer[head]!
    buffer[head++] = undefined as unknown as RunningAttempt
    if (head === buffer.length) {
      buffer.length = 0
      head = 0
    } else if (head > 1024 && head * 2 > buffer.length) {
      // under steady load the buffer may never run empty: drop the taken prefix now and then
      buffer.splice(0, head)
      head = 0
    }
    return entry
  }

  // Called once per attempt, from the attempt's own fiber, as soon as its handler is done: the
  // freed slot goes straight to the next buffered job, without a trip through the loop.
  // The bell is rung in place (a sliding queue never waits): no effect per job for it.
  const release: Effect.Effect<void, never, R> = Effect.suspend(() => {
    inFlight--
    finished++
    const next = stopping ? undefined : takeNext()
    if (next !== undefined) {
      inFlight++
      // the buffer runs low: the loop may claim again (it runs after this fiber yields)
      if (bufferedCount() * 2 <= prefetchTarget()) Queue.offerUnsafe(capacityBell, undefined)
      const started = executor.start(fibers, next, release)
      return permits === undefined ? started : Effect.andThen(releasePermits(1), started)
    }
    Queue.offerUnsafe(capacityBell, undefined)
    return permits === undefined ? Effect.void : releasePermits(1)
  })

  // Tier 1 (localKeyLimit): the next job whose key has room here; the others wait in the gate.
  const takeAdmitted = (): RunningAttempt | undefined => {
    for (let next = takeNext(); next !== undefined; next = takeNext()) {
      if (localKeys!.admit(KeyedDispatch.keyOf(next.job), next)) return next
    }
    return undefined
  }
  // Tier 1: each attempt's own release, which hands its key's slot to a held job of that key.
  const releaseOf = (entry: RunningAttempt): Effect.Effect<void, never, R> =>
    Effect.suspend(() => {
      if (permits !== undefined) return Effect.andThen(releasePermits(1), handOnKey(entry))
      return handOnKey(entry)
    })
  const handOnKey = (entry: RunningAttempt): Effect.Effect<void, never, R> =>
    Effect.suspend(() => {
      inFlight--
      finished++
      if (stopping) return ring(capacityBell)
      const next = localKeys!.finish<RunningAttempt>(KeyedDispatch.keyOf(entry.job)) ?? takeAdmitted()
      if (next === undefined) return ring(capacityBell)
      inFlight++
      return Effect.andThen(executor.start(fibers, next, releaseOf(next)), ring(capacityBell))
    })

  const startBuffered = Effect.suspend(() => {
    const starts: Array<Effect.Effect<void, never, R>> = []
    while (inFlight < config.maxConcurrency) {
      const next = localKeys === undefined ? takeNext() : takeAdmitted()
      if (next === undefined) break
      inFlight++
      starts.push(executor.start(fibers, next, localKeys === undefined ? release : releaseOf(next), true))
    }
    return Effect.all(starts, { discard: true })
  })

  // Consecutive claims that found nothing; the idle poll doubles with each while listening.
  let idleClaims = 0

  const pollWaitMs = Effect.suspend(() => {
    const pollIntervalMs = live.pollIntervalMs
    if (idleClaims === 0 || !wakes.listening()) return Effect.succeed(pollIntervalMs)
    const idlePollMaxMs = Math.max(pollIntervalMs, config.idlePollMaxMs)
    const backedOff = Math.min(idlePollMaxMs, pollIntervalMs * 2 ** Math.min(idleClaims, 30))
    return Effect.map(Random.next, (r) =>
      Math.max(1, Math.round(backedOff * (1 - idleJitter + 2 * idleJitter * r)))
    )
  })

  const waitForWork = Effect.flatMap(pollWaitMs, (ms) =>
    Queue.take(wakeBell).pipe(
      Effect.timeoutOption(ms),
      // a wake-up says work may be there: the next empty claim starts the backoff again
      Effect.flatMap((woken) =>
        Effect.sync(() => {
          if (woken._tag === "Some") idleClaims = 0
        })
      )
    )
  )

  /**
   * A gated claimer's wait (ADR 0037): for a wake-up (a closure's, or new work's) or the poll
   * interval, as `waitForWork`, announcing that it waits every `gatedAnnounceEveryMs` meanwhile.
   */
  const gatedWait = (announce: Effect.Effect<boolean>) =>
    Effect.gen(function* () {
      const until = (yield* Clock.currentTimeMillis) + (yield* pollWaitMs)
      while (true) {
        const left = until - (yield* Clock.currentTimeMillis)
        if (left <= 0) return
        const woken = yield* Queue.take(wakeBell).pipe(
          Effect.timeoutOption(Math.min(left, KeyedDispatch.gatedAnnounceEveryMs))
        )
        if (woken._tag === "Some") {
          idleClaims = 0
          return
        }
        yield* announce
      }
    })

  // Claiming a handful of jobs costs a round trip as much as a full batch: with little room,
  // wait briefly for more to free up (or for the linger to pass) so claims come in batches.
  const batchThreshold = Math.max(1, Math.floor(config.maxConcurrency / 4))
  let lingered = false

  // Wake-ups on demand: consecutive full claims (two make a backlog), and consecutive answers that
  // an insert in flight holds the queue's bucket (each doubles the short wait before the next claim,
  // for a transaction that stays open; a claim that finds jobs starts the count over: ADR 0042).
  let fullClaims = 0
  let bucketBusy = 0

  /**
   * Before waiting for a wake-up: true when this queue is registered as waiting (or registering
   * is not possible now: then the wait polls); false when the dispatcher must claim again first,
   * at once (just registered) or after a short wait (an insert in flight will send no wake-up).
   */
  const mayWait = Effect.suspend(() => {
    fullClaims = 0
    return Effect.flatMap(wakes.waitFor(config.queue), (waiting) => {
      if (waiting === "Busy") {
        const waitMs = Math.min(live.pollIntervalMs, 2 ** Math.min(bucketBusy, 8))
        bucketBusy += 1
        return Effect.as(Effect.sleep(waitMs), false)
      }
      bucketBusy = 0
      return Effect.succeed(waiting !== "Taken")
    })
  })

  const claimOnce = Effect.gen(function* () {
    const now = yield* Clock.currentTimeMillis
    // One rate sample per elapsed interval between claims; claims in the same millisecond share it.
    if (lastClaimAt === undefined) lastClaimAt = now
    else if (now > lastClaimAt) {
      const sample = (finished - finishedAtLastClaim) / (now - lastClaimAt)
      rate = rate === 0 ? sample : rate + smoothing * (sample - rate)
      lastClaimAt = now
      finishedAtLastClaim = finished
    }
    const want = config.maxConcurrency - inFlight + prefetchTarget() - bufferedCount()
    if (want <= 0) {
      yield* Queue.take(capacityBell)
      return
    }
    if (want < batchThreshold && !lingered) {
      lingered = true
      yield* Queue.take(capacityBell).pipe(Effect.timeoutOption(claimLingerMs))
      return
    }
    lingered = false
    let batch = live.claimBatchSize === undefined ? want : Math.min(want, live.claimBatchSize)
    // Rate: whole tokens only; none ⇒ sleep until the next one, then look again.
    const limiter = live.limiter
    if (limiter !== undefined) {
      const tokens = limiter.take(batch, now)
      if (tokens === 0) {
        metrics?.throttled(config.queue)
        yield* Effect.sleep(Math.max(1, Math.ceil(limiter.msUntilToken(now))))
        return
      }
      batch = tokens
    }
    // Weights: permits before the claim; none free ⇒ wait for a release (or a wake-up, or a poll).
    if (permits !== undefined) {
      const granted = permits.acquire(batch)
      if (granted < batch) limiter?.refund(batch - granted)
      if (granted === 0) {
        yield* Effect.raceFirst(permits.changed, waitForWork)
        return
      }
      batch = granted
    }
    // Resumed parked attempts first (capability 17): they take tokens and permits as new starts do.
    let resumedCount = 0
    if (callbacks !== undefined && (resumeWanted || now - lastResumeCheck >= resumeCheckMs)) {
      resumeWanted = false
      lastResumeCheck = now
      resumedCount = yield* callbacks.claimResumed(config.queue, batch).pipe(
        // a background look like the claim: no span unless asked for
        Effect.withSpan(
          `awa.claim-resumed ${config.queue}`,
          {
            attributes: { "awa.queue": config.queue }
          },
          { captureStackTrace: false }
        ),
        (take) => (config.backgroundSpans ? take : Effect.withTracerEnabled(take, false)),
        Effect.flatMap((jobs) =>
          Effect.map(Clock.currentTimeMillis, (heldAt) => {
            for (const job of jobs) buffer.push(executor.hold(job, heldAt))
            return jobs.length
          })
        ),
        Effect.uninterruptible,
        Effect.catchCause((cause) =>
          Effect.logWarning(`taking back resumed attempts failed on queue ${config.queue}`, cause).pipe(
            Effect.andThen(Effect.sync(() => (resumeWanted = true))),
            Effect.as(0)
          )
        )
      )
      if (resumedCount >= batch) {
        yield* startBuffered
        return
      }
    }
    // (an interruption leaves it set: the loop is being torn down, and a set flag only notes closures)
    claiming = true
    const { claimed, busy, capped, stoppedAtKey, nextTokenAt, failed } = yield* claimAttempts(
      now,
      batch - resumedCount
    )
    // a claim that found jobs ends a streak of busy buckets: the inserts that held it committed
    if (claimed > 0) bucketBusy = 0
    // (still `claiming` until `nothingLeft` says what this claim left: a closure announced while
    // the jobs start is noted for this claim's result too, not judged by the previous claim's)
    yield* startBuffered
    // A failed claim waits its poll interval here, after its release step gave back the permits
    // and tokens it took (waiting inside the claim held them for the whole interval), and asks
    // for no share of the pool meanwhile: it could not use one.
    if (failed) {
      endClaim()
      permits?.idle()
      return yield* Effect.sleep(live.pollIntervalMs)
    }
    // The fleet's rate cut the claim short: claim again when the next token is due (not at the
    // poll: starts spaced at the rate), with no idle backoff (ADR 0036).
    if (nextTokenAt !== undefined) {
      endClaim()
      if (claimed === 0) metrics?.throttled(config.queue)
      nothingLeft = false
      idleClaims = 0
      const waitMs = nextTokenAt - (yield* Clock.currentTimeMillis)
      return yield* Effect.sleep(Math.min(live.pollIntervalMs, Math.max(1, Math.ceil(waitMs))))
    }
    // Keys at their limit or a busy key lock are not an idle queue: no idle backoff (§23).
    const idle = claimed + resumedCount === 0 && busy === undefined
    // No closure can make more claimable: the claim found nothing, or took all it found (a keyed
    // claim says when it stopped short at a key, migration 0041).
    nothingLeft =
      claimed < batch - resumedCount && !capped && busy === undefined && stoppedAtKey === undefined
    const closedMeanwhile = endClaim()
    idleClaims = idle ? idleClaims + 1 : 0
    if (idle) permits?.idle()
    if (claimed === 0 && busy === "contended") return yield* KeyedDispatch.contendedBackoff
    // Stopped short at a key another claimer's lock held: that claimer's commit sends no signal (a
    // claim is not a closure), so retry after the same back-off rather than the poll interval.
    if (stoppedAtKey === "contended" && !capped) return yield* KeyedDispatch.contendedBackoff
    // Stopped at a key at its limit while a closure was announced: that closure may have freed
    // the grant after the claim read it, so claim again at once instead of waiting for the next.
    if (closedMeanwhile && (busy === "gated" || stoppedAtKey === "gated")) return
    // Stopped at a key at its limit: closers announce closures only while a claimer says it
    // waits (ADR 0037). Having just said so, claim once more: a closure that committed before the
    // closer heard it was not announced, and that claim sees it. Then wait, saying so again every
    // second, so that the closers' windows stay open however long the grant's holder runs.
    const announceGated = flow.announceGated
    if ((busy === "gated" || stoppedAtKey === "gated") && announceGated !== undefined && !capped) {
      if (yield* announceGated) return
      if (!(yield* mayWait)) return
      return yield* gatedWait(announceGated)
    }
    // A full batch (or a keyed claim cut at its per-call cap) means more may be waiting: claim
    // again at once; two in a row, a backlog: no wake-ups needed meanwhile. Gated: until a
    // closure's wake-up, or the poll interval at the latest.
    if (claimed < batch - resumedCount && !capped) {
      if (yield* mayWait) yield* waitForWork
    } else if (++fullClaims === 2) yield* wakes.stopWaiting(config.queue)
  })

  /**
   * One claim of up to `batch` jobs, its permits and tokens already taken. Whatever it did not
   * hand to the buffer (fewer rows, an error, an interruption, a defect) is given back in the
   * release step: tokens to the limiter, permits to the pool.
   */
  const claimAttempts = (now: number, batch: number) => {
    let held = 0
    let busy: KeyedDispatch.ClaimBatch["busy"]
    let capped = false
    let stoppedAtKey: KeyedDispatch.ClaimBatch["stoppedAtKey"]
    let nextTokenAt: number | undefined
    let failed = false
    return Effect.acquireUseRelease(
      Effect.void,
      () =>
        // Uninterruptible from the call to the hand-over: claimed jobs interrupted on the way would
        // stay claimed with nobody running them until rescued as stale.
        claimBatch({
          queue: config.queue,
          max: batch,
          deadlineMs: live.deadlineMs,
          agingIntervalMs: config.agingIntervalMs
        }).pipe(
          // an idle queue claims every poll interval: no span per poll unless asked for; no stack
          // trace (it would point here, and it was measurable per claim call in the drain profile)
          Effect.withSpan(
            `awa.claim ${config.queue}`,
            {
              attributes: { "awa.queue": config.queue }
            },
            { captureStackTrace: false }
          ),
          (claim) => (config.backgroundSpans ? claim : Effect.withTracerEnabled(claim, false)),
          Effect.flatMap((claimedBatch) =>
            Effect.map(Clock.currentTimeMillis, (heldAt) => {
              claimLatencyMs += smoothing * (Math.max(1, heldAt - now) - claimLatencyMs)
              for (const job of claimedBatch.jobs) buffer.push(executor.hold(job, heldAt))
              held = claimedBatch.jobs.length
              busy = claimedBatch.busy
              capped = claimedBatch.capped
              stoppedAtKey = claimedBatch.stoppedAtKey
              nextTokenAt = claimedBatch.nextTokenAt
              return held
            })
          ),
          Effect.uninterruptible,
          Effect.catchCause((cause) =>
            Effect.logWarning(
              `claim failed on queue ${config.queue}; retrying after the poll interval`,
              cause
            ).pipe(Effect.andThen(Effect.sync(() => (failed = true))), Effect.as(0))
          ),
          Effect.map((claimed) => ({ claimed, busy, capped, stoppedAtKey, nextTokenAt, failed }))
        ),
      () =>
        Effect.suspend(() => {
          live.limiter?.refund(batch - held)
          return releasePermits(batch - held)
        })
    )
  }

  const stop = Effect.suspend(() => {
    stopping = true
    const unstarted: Array<RunningAttempt> = localKeys === undefined ? [] : localKeys.drain<RunningAttempt>()
    for (let next = takeNext(); next !== undefined; next = takeNext()) unstarted.push(next)
    return Effect.andThen(executor.giveBack(unstarted), releasePermits(unstarted.length))
  })

  return {
    wake: ring(wakeBell),
    closed: Effect.suspend(() => {
      if (claiming) {
        closedWhileClaiming = true
        return Effect.void
      }
      return nothingLeft ? Effect.void : ring(wakeBell)
    }),
    resumed: Effect.suspend(() => {
      resumeWanted = true
      return ring(wakeBell)
    }),
    loop: Effect.forever(claimOnce).pipe(Effect.annotateLogs({ module: "Dispatcher", queue: config.queue })),
    stop
  } satisfies Dispatcher<R>
})
