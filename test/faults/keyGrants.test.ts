/**
 * Key-execution grants under real processes (capabilities.md §23, migration 0033,
 * docs/adr/0029-key-execution-grants.md): three worker processes claim one queue bound to a
 * policy of `maxInFlight` 2; every handler records its start and end with its key in `key_log`
 * (`jobs.ts`, `Keyed`), and the suite checks that at no instant more than 2 ran per key; and a
 * worker killed with kill -9 while holding grants does not leak them past rescue.
 */
import { KeyGrants, QueueStorage } from "@awa/storage"
import { TestDatabase } from "@awa/testing"
import { assert, describe, it } from "@effect/vitest"
import { Effect } from "effect"
import { SqlClient } from "effect/sql"
import {
  createFaultLog,
  describeWorker,
  eventually,
  startWorkers,
  suiteLayer,
  unfinished
} from "./harness.ts"
import { keyLogDdl, type WorkerConfig } from "./jobs.ts"

const maintenance = {
  electionInterval: 500,
  promoteInterval: 50,
  rescueInterval: 200,
  rotateInterval: 1000
} as const

const workerConfig = (name: string, queues: Record<string, unknown>): WorkerConfig => ({
  name,
  options: { queues, heartbeatInterval: 300, heartbeatStaleness: 1500, maintenance, shutdownTimeout: 5000 }
})

const onFreshDatabase = <A, E, R>(body: (url: string) => Effect.Effect<A, E, R>) =>
  Effect.gen(function* () {
    const { url } = yield* TestDatabase.acquire()
    return yield* Effect.gen(function* () {
      yield* createFaultLog
      const sql = yield* SqlClient.SqlClient
      yield* sql.unsafe(keyLogDdl).unprepared
      return yield* body(url)
    }).pipe(Effect.provide(suiteLayer(url)))
  })

/** A deterministic stream in [0, 1) (LCG), so a failing run can be replayed. */
const lcg = (seed: number) => {
  let x = seed >>> 0
  return () => {
    x = (Math.imul(x, 1664525) + 1013904223) >>> 0
    return x / 2 ** 32
  }
}

/** `n` keys drawn from `keys` keys: Zipf (weight 1/rank) or uniform. */
const drawKeys = (n: number, keys: number, zipf: boolean, random: () => number): Array<string> => {
  const weights = Array.from({ length: keys }, (_, i) => (zipf ? 1 / (i + 1) : 1))
  const total = weights.reduce((a, b) => a + b, 0)
  return Array.from({ length: n }, () => {
    let r = random() * total
    let k = 0
    while (r >= weights[k]! && k < keys - 1) r -= weights[k++]!
    return `tenant-${k}`
  })
}

/** Most attempts of one key running at one instant, from `key_log` (start inclusive, end exclusive). */
const peakPerKey = Effect.flatMap(SqlClient.SqlClient, (sql) =>
  sql<{ peak: number; intervals: number; open: number }>`
    WITH iv AS MATERIALIZED (
      SELECT s.key, s.at AS t0, e.at AS t1 FROM key_log s
      LEFT JOIN key_log e ON e.job_id = s.job_id AND e.run_lease = s.run_lease AND e.event = 'end'
      WHERE s.event = 'start'
    )
    SELECT coalesce(max(c), 0)::int AS peak, (SELECT count(*)::int FROM iv) AS intervals,
           (SELECT count(*)::int FROM iv WHERE t1 IS NULL) AS open
    FROM (SELECT (SELECT count(*) FROM iv b WHERE b.key = a.key AND b.t0 <= a.t0 AND (b.t1 IS NULL OR b.t1 > a.t0)) AS c
          FROM iv a) z`.pipe(Effect.map((rows) => rows[0]!))
)

describe("faults: key-execution grants", () => {
  it.live(
    "three worker processes, 5,000 jobs over 50 keys (Zipf and uniform) at maxInFlight 2: never more than 2 running per key",
    () =>
      onFreshDatabase((url) =>
        Effect.gen(function* () {
          const grants = yield* KeyGrants
          const storage = yield* QueueStorage
          yield* grants.create({ id: "tenants", maxInFlight: 2 })
          const queues = { keyed: { maxConcurrency: 20, keyPolicy: "tenants" } }
          const workers = yield* startWorkers(
            url,
            ["w1", "w2", "w3"].map((name) => workerConfig(name, queues))
          )
          const random = lcg(20)
          const keys = [...drawKeys(2500, 50, true, random), ...drawKeys(2500, 50, false, random)]
          const started = Date.now()
          // four priorities: four lanes, so a key at its limit at one lane's head does not hold
          // up the whole queue (head-of-line blocking is per lane, capabilities.md §23)
          for (let i = 0; i < keys.length; i += 500) {
            yield* storage.enqueueMany(
              keys.slice(i, i + 500).map((key, j) => ({
                kind: "keyed",
                queue: "keyed",
                priority: 1 + ((i + j) % 4),
                args: { key, ms: (i + j) % 4 },
                concurrencyKey: key
              }))
            )
          }
          const drained = yield* eventually(
            Effect.map(unfinished, (n) => n === 0),
            300_000,
            250
          )
          const wallMs = Date.now() - started
          const { peak, intervals, open } = yield* peakPerKey
          console.log(`key grants: ${keys.length} jobs drained in ${wallMs} ms; peak per key ${peak}`)
          assert.isTrue(drained, `not drained\n${workers.map((w) => describeWorker(w)).join("\n")}`)
          assert.strictEqual(open, 0)
          assert.isAtLeast(intervals, keys.length)
          assert.isAtMost(peak, 2, "more than maxInFlight attempts of one key ran at once")
          // the limit was reached (the check is not vacuous)
          assert.strictEqual(peak, 2)
          const stats = (yield* grants.stats).find((s) => s.policy === "tenants")
          assert.strictEqual(stats?.openGrants, 0)
        })
      ),
    400_000
  )

  it.live(
    "a worker killed with kill -9 while holding grants: rescue closes them and the keys run again",
    () =>
      onFreshDatabase((url) =>
        Effect.gen(function* () {
          const grants = yield* KeyGrants
          const storage = yield* QueueStorage
          const sql = yield* SqlClient.SqlClient
          yield* grants.create({ id: "solo", maxInFlight: 1 })
          const queues = { solo: { maxConcurrency: 10, keyPolicy: "solo" } }
          const workers = yield* startWorkers(
            url,
            ["w1", "w2", "w3"].map((name) => workerConfig(name, queues))
          )
          // six keys, three jobs each, lanes by key: long first jobs, so the victim holds grants
          yield* storage.enqueueMany(
            Array.from({ length: 18 }, (_, i) => ({
              kind: "keyed",
              queue: "solo",
              priority: 1 + (i % 3),
              args: { key: `k${i % 6}`, ms: i < 6 ? 4000 : 10 },
              concurrencyKey: `k${i % 6}`
            }))
          )
          const holding = (name: string) =>
            Effect.map(
              sql<{ n: number }>`
                SELECT count(*)::int AS n FROM key_log s
                WHERE s.worker = ${name} AND s.event = 'start'
                  AND NOT EXISTS (SELECT 1 FROM key_log e WHERE e.job_id = s.job_id AND e.run_lease = s.run_lease AND e.event = 'end')`,
              (rows) => rows[0]!.n
            )
          let victim = workers[0]!
          yield* eventually(
            Effect.gen(function* () {
              for (const w of workers) {
                if ((yield* holding(w.name)) > 0) {
                  victim = w
                  return true
                }
              }
              return false
            }),
            60_000,
            10
          )
          const held = yield* holding(victim.name)
          assert.isAtLeast(held, 1)
          victim.child.kill("SIGKILL")
          const drained = yield* eventually(
            Effect.map(unfinished, (n) => n === 0),
            120_000,
            200
          )
          assert.isTrue(drained, `not drained\n${workers.map((w) => describeWorker(w)).join("\n")}`)
          const stats = (yield* grants.stats).find((s) => s.policy === "solo")
          assert.strictEqual(stats?.openGrants, 0)
          const { peak } = yield* peakPerKey
          // the victim's handlers died with it (no end rows): only the survivors' runs count
          const rescued = yield* sql<{ n: number }>`
            SELECT count(*)::int AS n FROM awa.jobs j WHERE EXISTS (
              SELECT 1 FROM jsonb_array_elements(j.errors) e WHERE e ->> 'error' LIKE 'heartbeat stale%')`
          assert.isAtLeast(rescued[0]!.n, held)
          assert.isAtLeast(peak, 1)
        })
      ),
    300_000
  )
})
