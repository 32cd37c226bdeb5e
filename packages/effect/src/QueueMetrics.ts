/**
 * Queue and storage metrics through Effect's `Metric` (issue 18, capabilities.md §26), read from
 * the `Admin` service: the same numbers as `awa queues` and `awa status`, as instruments any
 * Effect metrics exporter sees (Prometheus text via `layerPrometheus`, OTLP via
 * `effect/observability`'s `OtlpMetrics` with `layerPolling`).
 *
 * Pulled, not pushed: each `collect` reads `queueStats` and the storage report (one round trip
 * each, costing what `awa queues` costs: the open work, never the history) and sets the gauges;
 * finalization counters advance by what the ledgers counted since the previous collection.
 * Instruments of the worker's own events (claims, handler durations, pickup latency) belong to
 * the runtime and are not here (docs/adr/0024-operator-surface.md).
 */
import { Admin } from "@awa/runtime"
import { type Duration, Effect, Layer, Metric, Schedule } from "effect"
import { HttpRouter, HttpServerResponse } from "effect/http"
import { PrometheusMetrics } from "effect/observability"

/** Jobs per queue and state (available, running, scheduled, retryable, dead_lettered). */
export const queueDepth = Metric.gauge("awa.queue.depth", { description: "jobs per queue and state" })
/** Seconds since the oldest available job of a queue became runnable (0 when none waits). */
export const oldestAvailableAge = Metric.gauge("awa.queue.oldest_available_age_seconds", {
  description: "seconds the oldest available job has waited"
})
/** Jobs finalized (outcome completed, failed or cancelled) per queue, since install. */
export const jobsFinalized = Metric.counter("awa.job.finalized", {
  description: "jobs finalized, by queue and outcome",
  incremental: true
})
/** Whether a queue is paused (1) or not (0). */
export const queuePaused = Metric.gauge("awa.queue.paused", { description: "1 when the queue is paused" })
/** Seconds the oldest unreclaimed slot of each ring has been waiting (0 when none). */
export const oldestUnprunedAge = Metric.gauge("awa.storage.oldest_unpruned_age_seconds", {
  description: "age of the oldest ring slot not yet reclaimed"
})
/** Bytes on disk of each ring's partitions. */
export const ringBytes = Metric.gauge("awa.storage.ring_bytes", {
  description: "bytes of each ring's partitions"
})
/** 1 while some session holds the maintenance leader's lock. */
export const leaderPresent = Metric.gauge("awa.leader.present", {
  description: "1 while a leader holds its lock"
})

const seconds = (from: Date | null, to: Date) =>
  from === null ? 0 : Math.max(0, (to.getTime() - from.getTime()) / 1000)

/**
 * A collector: reads statistics and status once and updates every instrument. The counters
 * remember the totals they last saw (per collector), so each collection adds only the difference.
 */
export const makeCollector = Effect.gen(function* () {
  const admin = yield* Admin.Admin
  const seen = new Map<string, number>()
  const advance = (queue: string, outcome: string, total: number) => {
    const key = `${queue}\u0000${outcome}`
    const delta = total - (seen.get(key) ?? 0)
    seen.set(key, total)
    return delta > 0
      ? Metric.update(jobsFinalized.pipe(Metric.withAttributes({ "awa.queue": queue, outcome })), delta)
      : Effect.void
  }
  return Effect.gen(function* () {
    const stats = yield* admin.queueStats()
    for (const q of stats.queues) {
      const at = (state: string) => queueDepth.pipe(Metric.withAttributes({ "awa.queue": q.queue, state }))
      yield* Metric.update(at("available"), q.available)
      yield* Metric.update(at("running"), q.running)
      yield* Metric.update(at("scheduled"), q.scheduled)
      yield* Metric.update(at("retryable"), q.retryable)
      yield* Metric.update(at("dead_lettered"), q.deadLettered)
      yield* Metric.update(
        oldestAvailableAge.pipe(Metric.withAttributes({ "awa.queue": q.queue })),
        seconds(q.oldestAvailableAt, stats.asOf)
      )
      yield* Metric.update(
        queuePaused.pipe(Metric.withAttributes({ "awa.queue": q.queue })),
        q.paused ? 1 : 0
      )
      yield* advance(q.queue, "completed", q.finalizedTotal.completed)
      yield* advance(q.queue, "failed", q.finalizedTotal.failed)
      yield* advance(q.queue, "cancelled", q.finalizedTotal.cancelled)
    }
    const report = yield* admin.status
    for (const ring of report.rings) {
      yield* Metric.update(
        oldestUnprunedAge.pipe(Metric.withAttributes({ ring: ring.ring })),
        seconds(ring.oldestUnpruned?.since ?? null, report.now)
      )
      yield* Metric.update(ringBytes.pipe(Metric.withAttributes({ ring: ring.ring })), ring.bytes)
    }
    yield* Metric.update(leaderPresent, report.leader === null ? 0 : 1)
  })
})

/**
 * `GET /metrics` (Prometheus text format) on the application's `HttpRouter`: each scrape
 * collects first, so the figures are as of the scrape.
 */
export const layerPrometheus = (options: { readonly path?: `/${string}` | undefined } = {}) =>
  Layer.effectDiscard(
    Effect.gen(function* () {
      const router = yield* HttpRouter.HttpRouter
      const collect = yield* makeCollector
      yield* router.add(
        "GET",
        options.path ?? "/metrics",
        Effect.gen(function* () {
          yield* Effect.ignore(collect)
          return HttpServerResponse.text(yield* PrometheusMetrics.format(), {
            contentType: "text/plain; version=0.0.4; charset=utf-8"
          })
        })
      )
    })
  )

/** Collects every `interval` in a background fiber (for push exporters such as OTLP). */
export const layerPolling = (interval: Duration.Input = "15 seconds") =>
  Layer.effectDiscard(
    Effect.gen(function* () {
      const collect = yield* makeCollector
      yield* Effect.forkScoped(Effect.repeat(Effect.ignore(collect), Schedule.spaced(interval)))
    })
  )
