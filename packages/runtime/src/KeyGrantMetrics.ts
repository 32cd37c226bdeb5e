/**
 * Instruments of per-key execution control (capabilities.md §23), beside `RuntimeMetrics`:
 *
 * - `awa.key.claims_busy` (counter, by `awa.queue` and `outcome` gated | contended): keyed claims
 *   of this process that claimed nothing because of keys. Counted by the dispatcher.
 * - `awa.key.open_grants`, `awa.key.keys_at_limit`, `awa.key.oldest_open_grant_age_seconds`
 *   (gauges by `awa.key_policy`) and `awa.key.draining_policies` (gauge): read from storage by
 *   `collect` (one query over the policies and their open grants; its cost grows with the
 *   retained claims of keyed queues), on demand or with `layerPolling`.
 */
import { KeyGrants } from "@awa/storage"
import { Clock, type Duration, Effect, Layer, Metric, Schedule } from "effect"

export { keyClaimsBusy } from "./KeyedDispatch.ts"

export const openGrants = Metric.gauge("awa.key.open_grants", {
  description: "open key grants (running or parked keyed attempts), by awa.key_policy"
})
export const keysAtLimit = Metric.gauge("awa.key.keys_at_limit", {
  description: "keys holding maxInFlight open grants or more, by awa.key_policy"
})
export const oldestOpenGrantAge = Metric.gauge("awa.key.oldest_open_grant_age_seconds", {
  description: "age of the oldest open key grant (0 when none), by awa.key_policy"
})
export const drainingPolicies = Metric.gauge("awa.key.draining_policies", {
  description: "key policies draining towards a lower limit"
})

/** Samples every policy into the gauges. */
export const collect = Effect.gen(function* () {
  const grants = yield* KeyGrants
  const stats = yield* grants.stats
  const now = yield* Clock.currentTimeMillis
  let draining = 0
  for (const s of stats) {
    const by = { "awa.key_policy": s.policy }
    yield* Metric.update(openGrants.pipe(Metric.withAttributes(by)), s.openGrants)
    yield* Metric.update(keysAtLimit.pipe(Metric.withAttributes(by)), s.keysAtLimit)
    const age = s.oldestOpenGrantAt === null ? 0 : Math.max(0, now - s.oldestOpenGrantAt.getTime()) / 1000
    yield* Metric.update(oldestOpenGrantAge.pipe(Metric.withAttributes(by)), age)
    if (s.state === "draining") draining++
  }
  yield* Metric.update(drainingPolicies, draining)
})

/** Collects every `interval` in the background while the layer is alive (errors are logged). */
export const layerPolling = (interval: Duration.Input): Layer.Layer<never, never, KeyGrants> =>
  Layer.effectDiscard(
    collect.pipe(
      Effect.catchCause((cause) => Effect.logWarning("key grant metrics not collected", cause)),
      Effect.repeat(Schedule.spaced(interval)),
      Effect.forkScoped
    )
  )
