/**
 * Reliability under faults, with workers as real separate Node processes (`worker-process.ts`).
 * Each scenario counts jobs enqueued, completed, executed more than once and lost, asserts
 * lost = 0 and every job finalized, and writes its figures to `results.json` (git-ignored;
 * `docs/reliability.md` shows a run's figures).
 *
 * Settings are short so the suite fits in CI: heartbeats every 300 ms, staleness 1.5 s (4 s in
 * the handler scenario, see there), elections every 500 ms, rescue sweeps every 200 ms.
 */
import { AwaClient } from "@awa/runtime"
import { EmbeddedPostgres, TestDatabase } from "@awa/testing"
import { assert, describe, it } from "@effect/vitest"
import { type Duration, Effect } from "effect"
import { SqlClient } from "effect/sql"
import {
  accounts,
  createFaultLog,
  describeWorker,
  eventually,
  executions,
  firstExecutionAfter,
  leaderLockHolders,
  release,
  report,
  spawnWorker,
  startWorkers,
  suiteLayer,
  tally,
  unfinished,
  type WorkerProcess,
  waitForEvent
} from "./harness.ts"
import * as Jobs from "./jobs.ts"
import { Work, type WorkerConfig } from "./jobs.ts"

const heartbeatInterval = 300
const heartbeatStaleness = 1500
const maintenance = {
  electionInterval: 500,
  promoteInterval: 50,
  rescueInterval: 200,
  rotateInterval: 1000
} as const

const workerConfig = (name: string, queues: Record<string, unknown>, extra: object = {}): WorkerConfig => ({
  name,
  options: { queues, heartbeatInterval, heartbeatStaleness, maintenance, shutdownTimeout: 5000, ...extra }
})

/** The workers' output, for failure messages. */
const dump = (workers: ReadonlyArray<WorkerProcess>) => workers.map(describeWorker).join("\n")

/** Runs `body` on a fresh migrated database with `fault_log`, the suite's client and SQL. */
const onFreshDatabase = <A, E, R>(body: (url: string) => Effect.Effect<A, E, R>) =>
  Effect.gen(function* () {
    const { url } = yield* TestDatabase.acquire()
    return yield* Effect.andThen(createFaultLog, body(url)).pipe(Effect.provide(suiteLayer(url)))
  })

const isLeader = (w: WorkerProcess) => w.events.filter((e) => e.event === "leader").at(-1)?.value === true

describe("faults: worker processes", () => {
  it.live(
    "1. kill -9 of one of three workers mid-drain: every job completes, only rescued attempts run again",
    () =>
      onFreshDatabase((url) =>
        Effect.gen(function* () {
          const started = Date.now()
          const workers = yield* startWorkers(
            url,
            ["w1", "w2", "w3"].map((name) => workerConfig(name, { work: { maxConcurrency: 20 } }))
          )
          const client = yield* AwaClient.AwaClient
          const total = 5000
          const ids = (yield* client.insertMany(
            Work,
            Array.from({ length: total }, (_, i) => ({ ms: (i * 37) % 51 })),
            { queue: "work" }
          )).map((j) => j.id)
          yield* eventually(
            Effect.map(executions, (n) => n >= total * 0.3),
            60_000,
            20
          )
          // a worker that is not the leader (leader loss is scenario 4), killed while it holds
          // at least five attempts
          const victim = workers.find((w) => !isLeader(w))!
          const sql = yield* SqlClient.SqlClient
          yield* eventually(
            Effect.map(
              sql<{ n: number }>`
                SELECT count(*)::int AS n FROM fault_log f JOIN awa.jobs j USING (job_id)
                WHERE f.worker = ${victim.name} AND j.state = 'running' AND j.run_lease = f.run_lease`,
              (rows) => rows[0]!.n >= 5
            ),
            30_000,
            5
          )
          const killedAt = Date.now()
          victim.child.kill("SIGKILL")
          const drained = yield* eventually(
            Effect.map(unfinished, (n) => n === 0),
            60_000,
            200
          )
          const all = yield* accounts
          const rescues = all.flatMap((a) =>
            a.errors
              .filter((e) => e.error.startsWith("heartbeat stale"))
              .map((e) => ({ job: a, attempt: e.attempt, at: Date.parse(e.at) }))
          )
          const lastRescue = Math.max(killedAt, ...rescues.map((r) => r.at))
          const { figures, lostJobs } = tally("kill -9 one of three workers", ids, all, {
            recoveryMs: lastRescue - killedAt,
            wallMs: Date.now() - started,
            notes: `${rescues.length} attempts rescued (staleness ${heartbeatStaleness} ms, sweep ${maintenance.rescueInterval} ms)`
          })
          yield* report("kill9", figures)
          assert.isTrue(drained, `not drained\n${dump(workers)}`)
          assert.deepStrictEqual(lostJobs, [], "lost jobs")
          assert.strictEqual(figures.completed, total)
          // extra executions only for attempts that were rescued, and only the victim's
          for (const a of all) {
            for (const run of a.runs.slice(0, -1)) {
              assert.strictEqual(
                run.pid,
                victim.pid,
                `job ${a.jobId}: a surviving worker's attempt ran again`
              )
              assert.isTrue(
                a.errors.some((e) => e.attempt === run.attempt && e.error.startsWith("heartbeat stale")),
                `job ${a.jobId}: attempt ${run.attempt} ran again without being rescued`
              )
            }
          }
          for (const r of rescues) {
            const run = r.job.runs.find((x) => x.attempt === r.attempt)
            if (run !== undefined)
              assert.strictEqual(run.pid, victim.pid, "only the victim's attempts are rescued")
            // A latency is the property: rescue within the staleness (1.5 s) and one sweep (200 ms)
            // of the kill. The 1.5 s beyond is for the leader's sweep and statement on a loaded
            // machine; a leader that did not sweep would still miss it.
            assert.isAtMost(r.at - killedAt, heartbeatStaleness + maintenance.rescueInterval + 1500)
          }
          assert.isAbove(rescues.length, 0, "the victim held attempts when it was killed")
          for (const w of workers) if (w !== victim) assert.isUndefined(w.exit, `${w.name} exited`)
        })
      ),
    300_000
  )

  it.live(
    "2. pg_terminate_backend of every worker connection, repeatedly: reconnect, leadership moves, nothing lost",
    () =>
      onFreshDatabase((url) =>
        Effect.gen(function* () {
          const started = Date.now()
          const sql = yield* SqlClient.SqlClient
          const workers = yield* startWorkers(
            url,
            ["w1", "w2", "w3"].map((name) => workerConfig(name, { work: { maxConcurrency: 20 } }))
          )
          const client = yield* AwaClient.AwaClient
          const total = 4000
          const ids = (yield* client.insertMany(
            Work,
            // 0–200 ms each (≥ 6.7 s of work for 60 slots): the drain outlasts the four rounds
            // however fast claiming is (with 0–20 ms jobs it sometimes ended before the last)
            Array.from({ length: total }, (_, i) => ({ ms: (i * 37) % 201 })),
            { queue: "work" }
          )).map((j) => j.id)
          yield* eventually(
            Effect.map(executions, (n) => n >= total * 0.1),
            60_000,
            20
          )
          const rounds = 4
          const killed = { pool: 0, listen: 0, leader: 0, heartbeat: 0, hot: 0 }
          const recoveries: Array<number> = []
          const takeovers: Array<number> = []
          const leaders: Array<string> = []
          const pending: Array<number> = []
          const listening = Effect.map(
            sql<{ n: number }>`
              SELECT count(DISTINCT application_name)::int AS n FROM pg_stat_activity
              WHERE datname = current_database() AND application_name LIKE 'awa-fault-w% signals'`,
            (rows) => rows[0]!.n
          )
          // the heartbeat threads' own connections (`Heartbeats.layerThread`, the default)
          const heartbeating = Effect.map(
            sql<{ n: number }>`
              SELECT count(DISTINCT application_name)::int AS n FROM pg_stat_activity
              WHERE datname = current_database() AND application_name LIKE 'awa-fault-w% heartbeat'`,
            (rows) => rows[0]!.n
          )
          // the workers with a hot-path connection (ADR 0033: the first opens at the first claim)
          const hotConnected = Effect.map(
            sql<{ n: number }>`
              SELECT count(DISTINCT application_name)::int AS n FROM pg_stat_activity
              WHERE datname = current_database() AND application_name LIKE 'awa-fault-w% hot 1'`,
            (rows) => rows[0]!.n
          )
          for (let round = 0; round < rounds; round++) {
            // every worker listens and heartbeats again and one holds the leader lock before the
            // next blow
            const ready = yield* eventually(
              Effect.map(
                Effect.all([listening, heartbeating, hotConnected, leaderLockHolders]),
                ([n, h, hot, holders]) =>
                  n === workers.length &&
                  h === workers.length &&
                  hot === workers.length &&
                  holders.length === 1
              ),
              10_000,
              20
            )
            assert.isTrue(ready, `round ${round}: listeners and leader back\n${dump(workers)}`)
            leaders.push((yield* leaderLockHolders)[0]!.replace("awa-fault-", ""))
            pending.push(yield* unfinished)
            const before = yield* executions
            const leaderEventsBefore = workers.map((w) => w.events.length)
            const at = Date.now()
            const victims = yield* sql<{ kind: "pool" | "listen" | "leader" | "heartbeat" | "hot" }>`
              WITH k AS (SELECT hashtextextended('awa:leader:awa', 0) AS key)
              SELECT CASE
                       WHEN EXISTS (SELECT 1 FROM pg_locks l, k
                                    WHERE l.pid = a.pid AND l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
                                      AND l.classid = ((k.key >> 32) & 4294967295)::oid
                                      AND l.objid = (k.key & 4294967295)::oid) THEN 'leader'
                       WHEN a.application_name LIKE '% signals' THEN 'listen'
                       WHEN a.application_name LIKE '% heartbeat' THEN 'heartbeat'
                       WHEN a.application_name LIKE '% hot %' THEN 'hot'
                       ELSE 'pool' END AS kind,
                     pg_terminate_backend(a.pid) AS terminated
              FROM pg_stat_activity a
              WHERE a.datname = current_database() AND a.application_name LIKE 'awa-fault-w%'`
            for (const v of victims) killed[v.kind]++
            // pickup resumes: new executions after the termination
            yield* eventually(
              Effect.map(executions, (n) => n > before),
              20_000,
              10
            )
            recoveries.push(Date.now() - at)
            // leadership is taken again (by whichever worker wins the next election)
            const tookOver = yield* eventually(
              Effect.sync(() =>
                workers.some((w, i) =>
                  w.events.slice(leaderEventsBefore[i]).some((e) => e.event === "leader" && e.value === true)
                )
              ),
              10_000,
              20
            )
            assert.isTrue(tookOver, `round ${round}: no worker took leadership again\n${dump(workers)}`)
            const firstLeader = Math.min(
              ...workers.flatMap((w, i) =>
                w.events
                  .slice(leaderEventsBefore[i])
                  .filter((e) => e.event === "leader" && e.value === true)
                  .map((e) => e.t)
              )
            )
            takeovers.push(firstLeader - at)
          }
          const drained = yield* eventually(
            Effect.map(unfinished, (n) => n === 0),
            60_000,
            200
          )
          // every worker has its LISTEN connection back
          const listeners = yield* listening
          const all = yield* accounts
          const rescued = all.filter((a) =>
            a.errors.some((e) => e.error.startsWith("heartbeat stale"))
          ).length
          const stale = workers.flatMap((w) => w.events.filter((e) => e.event === "stale")).length
          const { figures, lostJobs } = tally("pg_terminate_backend ×4, all worker connections", ids, all, {
            recoveryMs: Math.max(...recoveries),
            wallMs: Date.now() - started,
            notes:
              `terminated per round ≈ ${Math.round((killed.pool + killed.listen + killed.leader + killed.heartbeat + killed.hot) / rounds)} ` +
              `(pool ${killed.pool}, LISTEN ${killed.listen}, leader lock ${killed.leader}, heartbeat thread ${killed.heartbeat}, ` +
              `hot path ${killed.hot} in total); ` +
              `pickup resumed within ${Math.max(...recoveries)} ms, leadership retaken within ${Math.max(...takeovers)} ms ` +
              `(leader before each round: ${leaders.join(", ")}; jobs unfinished: ${pending.join(", ")}); ` +
              `${rescued} jobs rescued, ${stale} stale finalizations rejected`
          })
          yield* report("terminate", figures)
          assert.isTrue(drained, `not drained\n${dump(workers)}`)
          assert.deepStrictEqual(lostJobs, [], "lost jobs")
          assert.strictEqual(figures.completed, total)
          // a finalization lost with its connection is retried (CompletionBatcher), not re-run later
          assert.strictEqual(figures.duplicates, 0, "no job ran twice")
          assert.isAbove(pending.at(-1)!, 0, "the last round still hit a drain")
          assert.strictEqual(killed.leader, rounds, "the leader's lock connection was terminated every round")
          assert.isAtLeast(killed.listen, rounds * workers.length, "every LISTEN connection was terminated")
          assert.strictEqual(
            killed.heartbeat,
            rounds * workers.length,
            "every heartbeat thread's connection was terminated every round"
          )
          assert.isAtLeast(
            killed.hot,
            rounds * workers.length,
            "every worker's hot-path connections were terminated every round"
          )
          assert.strictEqual(listeners, workers.length, "every worker listens again")
          for (const w of workers) assert.isUndefined(w.exit, `${w.name} exited\n${describeWorker(w)}`)
        })
      ),
    300_000
  )

  it.live(
    "3. Postgres stopped and restarted mid-drain: workers survive and resume within seconds, nothing lost",
    () =>
      Effect.gen(function* () {
        // a server of its own: the shared one must not go down under the other test files
        const server = yield* Effect.acquireRelease(
          Effect.promise(() => EmbeddedPostgres.startTemporary()),
          (s) => Effect.promise(() => s.stop())
        )
        const url = server.url
        yield* Effect.gen(function* () {
          const started = Date.now()
          yield* createFaultLog
          // Twice the suite's staleness, and an outage twice that: after the restart every pool
          // reconnects and every heartbeat lands within one staleness of the new leader's term,
          // which at 1.5 s a loaded CI machine missed once (51 attempts rescued and run twice
          // with the whole suite running beside it); the property is the same at any staleness.
          const restartStaleness = 2 * heartbeatStaleness
          const workers = yield* startWorkers(
            url,
            ["w1", "w2", "w3"].map((name) =>
              workerConfig(name, { work: { maxConcurrency: 20 } }, { heartbeatStaleness: restartStaleness })
            )
          )
          const client = yield* AwaClient.AwaClient
          const total = 3000
          const ids = (yield* client.insertMany(
            Work,
            Array.from({ length: total }, (_, i) => ({ ms: (i * 37) % 21 })),
            { queue: "work" }
          )).map((j) => j.id)
          yield* eventually(
            Effect.map(executions, (n) => n >= total * 0.2),
            60_000,
            20
          )
          const downtimeMs = 2 * restartStaleness
          const pendingAtStop = yield* unfinished
          const { stoppedAt, readyAt } = yield* Effect.promise(() => server.restart!({ downtimeMs }))
          let resumedAt: number | undefined
          yield* eventually(
            Effect.map(firstExecutionAfter(readyAt), (at) => {
              resumedAt = at
              return at !== undefined
            }),
            30_000,
            50
          )
          const drained = yield* eventually(
            Effect.map(unfinished, (n) => n === 0),
            60_000,
            200
          )
          const all = yield* Effect.retry(accounts, { times: 5 })
          const rescued = all.filter((a) =>
            a.errors.some((e) => e.error.startsWith("heartbeat stale"))
          ).length
          const recoveryMs = resumedAt === undefined ? null : resumedAt - readyAt
          const { figures, lostJobs } = tally(
            `Postgres stopped ${downtimeMs / 1000} s and restarted`,
            ids,
            all,
            {
              recoveryMs,
              wallMs: Date.now() - started,
              notes:
                `server down ${readyAt - stoppedAt} ms with ${pendingAtStop} jobs unfinished (fast shutdown, same data dir and port); ` +
                `first execution ${recoveryMs} ms after it accepted connections again; ${rescued} jobs rescued`
            }
          )
          yield* report("restart", figures)
          assert.isTrue(drained, `not drained\n${dump(workers)}`)
          assert.deepStrictEqual(lostJobs, [], "lost jobs")
          assert.strictEqual(figures.completed, total)
          // nobody could heartbeat during the outage; the new leader lets heartbeats land before it
          // sweeps (Leader), and finalizations lost in the outage are retried (CompletionBatcher)
          assert.strictEqual(figures.duplicates, 0, "no job ran twice")
          assert.isAbove(pendingAtStop, 0, "the server went down mid-drain")
          assert.isNotNull(recoveryMs, "pickup resumed")
          // A latency is the property: pickup resumes within seconds of the server accepting
          // connections, through pools that reconnect on demand. 5 s is the bound the docs state.
          assert.isAtMost(recoveryMs!, 5000, "pickup resumed within seconds")
          for (const w of workers) assert.isUndefined(w.exit, `${w.name} exited\n${describeWorker(w)}`)
        }).pipe(Effect.provide(suiteLayer(url, { migrateOnStart: true })))
      }),
    300_000
  )

  it.live(
    "4. the leader process killed: another takes over within the election interval; promotion and rescue go on",
    () =>
      onFreshDatabase((url) =>
        Effect.gen(function* () {
          const started = Date.now()
          const workers = yield* startWorkers(
            url,
            ["w1", "w2", "w3"].map((name) =>
              workerConfig(name, { work: { maxConcurrency: 20 }, due: { maxConcurrency: 10 } })
            )
          )
          yield* eventually(
            Effect.sync(() => workers.some(isLeader)),
            10_000,
            20
          )
          // the leader by Postgres' lock table agrees with what the workers report
          const holders = yield* leaderLockHolders
          assert.strictEqual(holders.length, 1, `one lock holder: ${holders}\n${dump(workers)}`)
          assert.deepStrictEqual(
            workers.filter(isLeader).map((w) => `awa-fault-${w.name}`),
            holders,
            `reported leaders match the lock holder\n${dump(workers)}`
          )
          const leader = workers.find(isLeader)!
          const client = yield* AwaClient.AwaClient
          const now = 1500
          // every tenth job runs 1 s, so every worker (the leader too) holds attempts when killed
          const ids = (yield* client.insertMany(
            Work,
            Array.from({ length: now }, (_, i) => ({ ms: i % 10 === 0 ? 1000 : (i * 37) % 51 })),
            { queue: "work" }
          )).map((j) => j.id)
          // kill it while it holds at least three attempts
          const sql = yield* SqlClient.SqlClient
          yield* eventually(
            Effect.map(
              sql<{ n: number }>`
                SELECT count(*)::int AS n FROM fault_log f JOIN awa.jobs j USING (job_id)
                WHERE f.worker = ${leader.name} AND j.state = 'running' AND j.run_lease = f.run_lease`,
              (rows) => rows[0]!.n >= 3
            ),
            30_000,
            20
          )
          const killedAt = Date.now()
          leader.child.kill("SIGKILL")
          const survivors = workers.filter((w) => w !== leader)
          const tookOver = yield* eventually(
            Effect.sync(() => survivors.some(isLeader)),
            10_000,
            10
          )
          const takeoverAt = Math.min(
            ...survivors.flatMap((w) =>
              w.events
                .filter((e) => e.event === "leader" && e.value === true && e.t >= killedAt)
                .map((e) => e.t)
            )
          )
          // Scheduled once the new leader is known (a condition, not a guess at how long the kill
          // and takeover take), on a queue without backlog: only its promotion makes them
          // runnable, and their pickup lag measures it.
          const due = new Set<bigint>()
          for (let s = 1; s <= 4; s++) {
            const delayed = yield* client.insertMany(
              Work,
              Array.from({ length: 50 }, () => ({ ms: 10 })),
              { queue: "due", delay: s * 1000 }
            )
            for (const j of delayed) {
              ids.push(j.id)
              due.add(j.id)
            }
          }
          // When each is first seen promoted (no longer `scheduled`), polled from here: the
          // property is the new leader's promotion, not the workers' pickup after it, which a
          // loaded machine stretches (4.0 s from due to started under two CPU hogs). `now()` is
          // the poll's snapshot: a job seen promoted was promoted before it, however long the
          // view then takes to read.
          const promotedAt = new Map<bigint, number>()
          yield* Effect.forkScoped(
            Effect.gen(function* () {
              while (promotedAt.size < due.size) {
                const rows = yield* sql<{ job_id: bigint; seen: Date }>`
                  SELECT job_id, now() AS seen FROM awa.jobs WHERE queue = 'due' AND state <> 'scheduled'`
                for (const r of rows)
                  if (!promotedAt.has(r.job_id)) promotedAt.set(r.job_id, r.seen.getTime())
                yield* Effect.sleep(25)
              }
            }).pipe(Effect.catchCause((cause) => Effect.logWarning("promotion watch failed", cause)))
          )
          const drained = yield* eventually(
            Effect.map(unfinished, (n) => n === 0),
            60_000,
            200
          )
          const all = yield* accounts
          const rescued = all.filter((a) => a.errors.some((e) => e.error.startsWith("heartbeat stale")))
          // promotion lag (due to seen promoted) and pickup lag (due to started) of the jobs that
          // came due after the new leader took over
          const dueJobs = all.filter((a) => due.has(a.jobId) && a.runAt.getTime() > takeoverAt)
          const lags = dueJobs
            .filter((a) => promotedAt.has(a.jobId))
            .map((a) => promotedAt.get(a.jobId)! - a.runAt.getTime())
          const maxLag = Math.max(0, ...lags)
          const maxPickup = Math.max(
            0,
            ...dueJobs
              .filter((a) => a.runs.length > 0)
              .map((a) => a.runs.at(-1)!.at.getTime() - a.runAt.getTime())
          )
          const { figures, lostJobs } = tally("leader process killed (kill -9)", ids, all, {
            recoveryMs: takeoverAt - killedAt,
            wallMs: Date.now() - started,
            notes:
              `new leader after ${takeoverAt - killedAt} ms (election interval ${maintenance.electionInterval} ms); ` +
              `${rescued.length} of the old leader's attempts rescued by the new one; ` +
              `${lags.length} jobs promoted by the new leader, the last ${maxLag} ms after due (picked up ≤ ${maxPickup} ms after due)`
          })
          yield* report("leader", figures)
          assert.isTrue(tookOver, `no survivor took leadership\n${dump(workers)}`)
          assert.isTrue(drained, `not drained\n${dump(workers)}`)
          assert.deepStrictEqual(lostJobs, [], "lost jobs")
          assert.strictEqual(figures.completed, ids.length)
          // The property is a latency: a survivor takes the lock within its next election tick
          // (500 ms) once Postgres has released it. The 1 s beyond is for a loaded machine
          // noticing the dead backend and scheduling the survivor's tick.
          assert.isAtMost(
            takeoverAt - killedAt,
            maintenance.electionInterval + 1000,
            "takeover within the election interval"
          )
          assert.isAbove(rescued.length, 0, "the old leader's attempts were rescued")
          assert.strictEqual(
            lags.length,
            due.size,
            "every scheduled job came due after the takeover and was promoted"
          )
          assert.isTrue(
            dueJobs.every((a) => a.state === "completed" && a.runs.length === 1),
            "every scheduled job ran once"
          )
          // A latency is the property here, so a bound stays: one promotion tick (50 ms), the
          // promote statement, and this test's 25 ms poll. 5 s is 100 promotion intervals: a
          // leader that stopped promoting fails it, a loaded machine's delays do not (2.5 s was
          // exceeded once, 3.1 s, while four other sessions ran their suites on the two cores).
          assert.isAtMost(maxLag, 5000, "promotion keeps up under the new leader")
          for (const a of rescued) assert.strictEqual(a.state, "completed")
          assert.strictEqual(survivors.filter(isLeader).length, 1, "exactly one leader")
        })
      ),
    300_000
  )

  it.live(
    "5. misbehaving handlers: each ends as its contract says; stalls and stuck handlers get nobody else rescued",
    () =>
      onFreshDatabase((url) =>
        Effect.gen(function* () {
          const started = Date.now()
          // Staleness 4 s, heartbeats every 500 ms. Heartbeats come from each worker's thread (the
          // default), so the 2 s event-loop stall of phase 1 does not delay them at all; with
          // `watchdog: { thread: false }` it would delay one by at most 2 s + one interval + a
          // round trip (≈ 2.6 s), still short of 4 s.
          const hb = { heartbeatInterval: 500, heartbeatStaleness: 4000 }
          // Deadlines only on queues whose handlers are meant to exceed them (hang, ignore
          // interruption or the AbortSignal), and long enough (5 s) that their second attempts,
          // which record their start and return, finish well inside on a loaded machine: with
          // 1 s (Effect) and 3 s (promise) a slow fault_log insert under CPU load was cut off as
          // "hard deadline exceeded". Handlers that only record and throw have no deadline at all.
          const deadlineMs = 5000
          // `long` takes 8 attempts per process: both Effect workers hold long attempts throughout
          const queues = {
            long: { maxConcurrency: 8 },
            steady: { maxConcurrency: 20 },
            deadline: { maxConcurrency: 10, deadline: deadlineMs }
          }
          const workers = yield* startWorkers(url, [
            workerConfig("e1", queues, hb),
            workerConfig("e2", queues, hb),
            {
              ...workerConfig(
                "p1",
                {
                  promise: { maxConcurrency: 10 },
                  promise_deadline: { maxConcurrency: 10, deadline: deadlineMs }
                },
                hb
              ),
              facade: "promise"
            }
          ])
          const client = yield* AwaClient.AwaClient
          const ids: Array<bigint> = []
          const add = (jobs: ReadonlyArray<{ id: bigint }>) => {
            for (const j of jobs) ids.push(j.id)
            return jobs.map((j) => j.id)
          }
          // Long, well-behaved attempts on both Effect workers, alive through both phases (they run
          // until released, after everything else has finished): they must never be rescued,
          // whatever their neighbours do.
          const steady = add(
            yield* client.insertMany(
              Jobs.Held,
              Array.from({ length: 16 }, () => ({ maxMs: 240_000 })),
              { queue: "long" }
            )
          )
          yield* eventually(
            Effect.map(executions, (n) => n >= 16),
            10_000,
            20
          )
          // Phase 1: a handler blocks its process's event loop for 2 s.
          const [block] = add(yield* client.insertMany(Jobs.BlockLoop, [{ ms: 2000 }], { queue: "steady" }))
          const sql = yield* SqlClient.SqlClient
          yield* eventually(
            Effect.map(
              sql<{ state: string }>`SELECT state FROM awa.jobs WHERE job_id = ${block!}`,
              (rows) => rows[0]?.state === "completed"
            ),
            20_000,
            50
          )
          // Phase 2: everything else at once.
          const n3 = [{ n: 1 }, { n: 2 }, { n: 3 }]
          const q = { queue: "steady" }
          const qd = { queue: "deadline" }
          const qp = { queue: "promise" }
          const qpd = { queue: "promise_deadline" }
          add(yield* client.insertMany(Jobs.Throws, n3, { ...q, maxAttempts: 2 }))
          add(yield* client.insertMany(Jobs.ThrowsOutside, n3, { ...q, maxAttempts: 2 }))
          add(yield* client.insertMany(Jobs.Fails, n3, { ...q, maxAttempts: 2 }))
          add(yield* client.insertMany(Jobs.Dies, n3, { ...q, maxAttempts: 2 }))
          add(yield* client.insertMany(Jobs.Terminal, n3, q))
          const ok = add(
            yield* client.insertMany(
              Work,
              Array.from({ length: 200 }, (_, i) => ({ ms: i % 20 })),
              q
            )
          )
          add(yield* client.insertMany(Jobs.HangOnce, n3, qd))
          add(yield* client.insertMany(Jobs.HangAlways, n3.slice(0, 2), { ...qd, maxAttempts: 3 }))
          // ignores interruption for 8 s: longer than the deadline (5 s) and the staleness (4 s)
          add(yield* client.insertMany(Jobs.Uninterruptible, [{ ms: 8000 }], qd))
          add(yield* client.insertMany(Jobs.PromiseRejects, n3, { ...qp, maxAttempts: 2 }))
          add(yield* client.insertMany(Jobs.PromiseThrowsSync, n3, { ...qp, maxAttempts: 2 }))
          add(yield* client.insertMany(Jobs.PromiseTerminal, n3, qp))
          // past its queue's 5 s deadline
          add(yield* client.insertMany(Jobs.PromiseIgnoresAbort, [{ ms: 8000 }, { ms: 8000 }], qpd))
          const pOk = add(
            yield* client.insertMany(
              Jobs.PromiseOk,
              Array.from({ length: 50 }, (_, n) => ({ n })),
              qp
            )
          )

          // everything but the long attempts ends; then they are released
          const rest = yield* eventually(
            Effect.map(unfinished, (n) => n === steady.length),
            120_000,
            200
          )
          yield* release(steady)
          const drained =
            rest &&
            (yield* eventually(
              Effect.map(unfinished, (n) => n === 0),
              60_000,
              200
            ))
          const all = yield* accounts
          const byId = new Map(all.map((a) => [a.jobId, a]))
          const { figures, lostJobs } = tally("misbehaving handlers", ids, all, {
            recoveryMs: null,
            wallMs: Date.now() - started,
            notes:
              "throw/typed failure/defect/rejection/sync throw: failed after maxAttempts with the reason; terminal: after 1; " +
              "hang past deadline (5 s): retried; always hanging: failed after 3 deadline errors; uninterruptible (8 s) and " +
              "AbortSignal-ignoring attempts (8 s): retried; 2 s event-loop stall: nobody rescued (staleness 4 s; " +
              `stall warnings logged: ${JSON.stringify(workers.flatMap((w) => w.stalls))} ms)`
          })
          yield* report("handlers", figures)

          const expectations: Record<string, { state: string; errors: ReadonlyArray<string> }> = {
            throws: {
              state: "failed",
              errors: ["defect: Error: handler threw", "defect: Error: handler threw"]
            },
            throws_outside: {
              state: "failed",
              errors: [
                "defect: Error: threw before returning an Effect",
                "defect: Error: threw before returning an Effect"
              ]
            },
            fails: { state: "failed", errors: ["handler failed", "handler failed"] },
            dies: {
              state: "failed",
              errors: ["defect: Error: handler returned a defect", "defect: Error: handler returned a defect"]
            },
            terminal: { state: "failed", errors: ["handler gave up"] },
            hang_once: { state: "completed", errors: ["hard deadline exceeded"] },
            hang_always: {
              state: "failed",
              errors: ["hard deadline exceeded", "hard deadline exceeded", "hard deadline exceeded"]
            },
            uninterruptible: { state: "completed", errors: ["hard deadline exceeded"] },
            block_loop: { state: "completed", errors: [] },
            held: { state: "completed", errors: [] },
            work: { state: "completed", errors: [] },
            p_rejects: { state: "failed", errors: ["promise rejected", "promise rejected"] },
            p_throws_sync: {
              state: "failed",
              errors: ["threw before returning a promise", "threw before returning a promise"]
            },
            p_terminal: { state: "failed", errors: ["promise gave up"] },
            p_ignores_abort: { state: "completed", errors: ["hard deadline exceeded"] },
            p_ok: { state: "completed", errors: [] }
          }
          const problems: Array<string> = []
          for (const id of ids) {
            const a = byId.get(id)!
            const want = expectations[a.kind]!
            const got = { state: a.state, errors: a.errors.map((e) => e.error), runs: a.runs.length }
            if (got.state !== want.state || JSON.stringify(got.errors) !== JSON.stringify(want.errors))
              problems.push(`${a.kind} #${id}: ${JSON.stringify(got)}, expected ${JSON.stringify(want)}`)
            // one recorded execution per attempt (a failed job's last error is its last attempt)
            const attempts =
              a.kind === "throws_outside"
                ? 0
                : want.state === "failed"
                  ? want.errors.length
                  : want.errors.length + 1
            if (a.runs.length !== attempts)
              problems.push(`${a.kind} #${id}: ${a.runs.length} executions, expected ${attempts}`)
          }
          assert.isTrue(drained, `not drained\n${problems.join("\n")}\n${dump(workers)}`)
          assert.deepStrictEqual(lostJobs, [], "lost jobs")
          assert.deepStrictEqual(problems, [], `handler outcomes\n${dump(workers)}`)
          // nothing else was affected: one attempt each, never rescued
          for (const id of [...steady, ...ok, ...pOk]) assert.strictEqual(byId.get(id)!.attempt, 1)
          for (const w of workers) assert.isUndefined(w.exit, `${w.name} exited`)
        })
      ),
    300_000
  )

  it.live(
    "6. bad input at enqueue and at execution: a typed error or a terminal failure with its reason, nothing else affected",
    () =>
      onFreshDatabase((url) =>
        Effect.gen(function* () {
          const started = Date.now()
          const sql = yield* SqlClient.SqlClient
          const client = yield* AwaClient.AwaClient
          const storage = client.storage

          // --- at enqueue: a ValidationError naming the field, and nothing written ---------------
          const ok = { ms: 1 }
          const cases: ReadonlyArray<readonly [string, Effect.Effect<unknown, unknown>, string]> = [
            [
              "args failing their schema",
              client.insert(Work, { ms: "soon" } as unknown as { ms: number }),
              "args"
            ],
            [
              "args over the 1 MiB limit",
              client.insert(Jobs.Injected, { s: "x".repeat(1024 * 1024) }),
              "args"
            ],
            [
              "args that are not JSON",
              storage.enqueueMany([{ kind: "work", args: { ms: Number.NaN } }]),
              "args.ms"
            ],
            ["args with a NUL", storage.enqueueMany([{ kind: "work", args: { s: "a\u0000b" } }]), "args.s"],
            [
              "one bad job in a batch",
              client.insertMany(Work, [ok, ok, { ms: "x" } as unknown as { ms: number }]),
              "args"
            ],
            ["empty queue name", client.insert(Work, ok, { queue: "" }), "queue"],
            ["queue name with surrounding whitespace", client.insert(Work, ok, { queue: " q " }), "queue"],
            ["queue name with NUL", client.insert(Work, ok, { queue: "q\u0000" }), "queue"],
            ["queue name of 201 characters", client.insert(Work, ok, { queue: "q".repeat(201) }), "queue"],
            ["empty kind", storage.enqueueMany([{ kind: "", args: {} }]), "kind"],
            ["kind of 201 characters", storage.enqueueMany([{ kind: "k".repeat(201), args: {} }]), "kind"],
            ["priority 0", client.insert(Work, ok, { priority: 0 }), "priority"],
            ["priority 5", client.insert(Work, ok, { priority: 5 }), "priority"],
            ["priority 1.5", client.insert(Work, ok, { priority: 1.5 }), "priority"],
            ["maxAttempts 0", client.insert(Work, ok, { maxAttempts: 0 }), "maxAttempts"],
            ["maxAttempts 1001", client.insert(Work, ok, { maxAttempts: 1001 }), "maxAttempts"],
            [
              "21 tags",
              client.insert(Work, ok, { tags: Array.from({ length: 21 }, (_, i) => `t${i}`) }),
              "tags"
            ],
            ["an empty tag", client.insert(Work, ok, { tags: [""] }), "tags[0]"],
            ["a tag of 101 characters", client.insert(Work, ok, { tags: ["t".repeat(101)] }), "tags[0]"],
            ["an invalid runAt", client.insert(Work, ok, { runAt: new Date("not a date") }), "runAt"],
            ["an unparseable delay", client.insert(Work, ok, { delay: "soon" as Duration.Input }), "delay"],
            [
              "a reserved metadata key",
              client.insert(Work, ok, { metadata: { "awa:owner": "me" } }),
              "metadata.awa:owner"
            ],
            ["metadata that is not JSON", client.insert(Work, ok, { metadata: { n: 1n } }), "metadata.n"],
            [
              "unique period under 1 s",
              client.insert(Work, ok, { unique: { byPeriodMs: 10 } }),
              "unique.byPeriodMs"
            ],
            ["pausing an invalid queue", storage.pauseQueue(""), "queue"],
            [
              "claiming an invalid queue",
              storage.claim({ queue: " ", max: 1, deadlineMs: 0, agingIntervalMs: 0 }),
              "queue"
            ]
          ]
          const rejections: Array<string> = []
          for (const [label, effect, field] of cases) {
            const error = (yield* Effect.flip(effect)) as { _tag?: string; field?: string; message?: string }
            assert.strictEqual(error._tag, "ValidationError", `${label}: ${String(error)}`)
            assert.strictEqual(error.field, field, `${label}: ${error.message}`)
            rejections.push(`${label} → ${error.message}`)
          }
          const written = yield* sql<{ n: number }>`SELECT count(*)::int AS n FROM awa.jobs`
          assert.strictEqual(written[0]!.n, 0, "nothing rejected was written")

          // invalid worker options: the worker process refuses to start, naming every issue
          const invalid = spawnWorker(url, {
            name: "invalid",
            options: {
              queues: { " padded ": {}, fine: { maxConcurrency: 0, pollInterval: "soon" } },
              heartbeatInterval: 1000,
              heartbeatStaleness: 500
            }
          })
          const exit = yield* Effect.promise(() => invalid.exited)
          const said = invalid.output.join("\n")
          assert.strictEqual(exit.code, 1, said)
          for (const path of [
            "queues. padded ",
            "queues.fine.maxConcurrency",
            "queues.fine.pollInterval",
            "heartbeatStaleness"
          ])
            assert.include(said, path)
          assert.include(said, "AwaConfigError")

          // --- at execution -----------------------------------------------------------------
          const workers = yield* startWorkers(
            url,
            ["w1", "w2"].map((name) =>
              workerConfig(
                name,
                {
                  bad: { maxConcurrency: 20 },
                  [Jobs.injection.queue]: { maxConcurrency: 5 }
                },
                // the scenario checks the terminal path; the default is now "retry" (ADR 0020)
                { onUnknownKind: "fail" }
              )
            )
          )
          const ids: Array<bigint> = []
          const add = (jobs: ReadonlyArray<{ id: bigint }>) => {
            for (const j of jobs) ids.push(j.id)
            return jobs.map((j) => j.id)
          }
          const q = { queue: "bad" }
          const good = add(
            yield* client.insertMany(
              Work,
              Array.from({ length: 300 }, (_, i) => ({ ms: i % 20 })),
              q
            )
          )
          // written below the client's Schema check, as another producer (or an old version) might
          const [undecodable] = add(
            yield* storage.enqueueMany([{ kind: "work", queue: "bad", args: { ms: "soon" } }])
          )
          const [unknown] = add(
            yield* storage.enqueueMany([{ kind: "no_such_kind", queue: "bad", args: {} }])
          )
          add(yield* client.insertMany(Jobs.BadBackoff, [{ n: 1 }, { n: 2 }, { n: 3 }], q))
          add(yield* client.insertMany(Jobs.ThrowingBackoff, [{ n: 1 }, { n: 2 }, { n: 3 }], q))
          for (const variant of ["negative_retry", "huge_snooze", "unparseable", "null"] as const)
            add(yield* client.insertMany(Jobs.BadResult, [{ variant }], q))
          const inj = Jobs.injection
          const injected = add(
            yield* client.insertMany(
              Jobs.Injected,
              Array.from({ length: 5 }, () => ({ s: inj.metadata.nested.a })),
              { queue: inj.queue, tags: inj.tags, metadata: inj.metadata }
            )
          )
          add(
            yield* client.insertMany(
              Work,
              Array.from({ length: 20 }, () => ({ ms: 1 })),
              { queue: inj.queue, tags: inj.tags }
            )
          )

          const drained = yield* eventually(
            Effect.map(unfinished, (n) => n === 0),
            60_000,
            200
          )
          const all = yield* accounts
          const byId = new Map(all.map((a) => [a.jobId, a]))
          const { figures, lostJobs } = tally("bad input", ids, all, {
            recoveryMs: null,
            wallMs: Date.now() - started,
            logs: (kind) => kind !== "no_such_kind",
            notes: `${cases.length} invalid enqueues rejected with a ValidationError (nothing written); invalid worker options refused with an AwaConfigError; undecodable args and unknown kind failed terminally with the reason; invalid backoff/outcome values retried; SQL-injection-shaped queue, kind, tags and metadata stored verbatim and run`
          })
          yield* report("input", figures)
          assert.isTrue(drained, `not drained\n${dump(workers)}`)
          assert.deepStrictEqual(lostJobs, [], "lost jobs")

          const u = byId.get(undecodable!)!
          assert.strictEqual(u.state, "failed")
          assert.strictEqual(u.runs.length, 0, "the handler never saw undecodable args")
          assert.match(u.errors[0]!.error, /^args failed to decode: /)
          assert.isTrue(u.errors[0]!.terminal)
          const k = byId.get(unknown!)!
          assert.strictEqual(k.state, "failed")
          assert.deepStrictEqual(
            k.errors.map((e) => [e.error, e.terminal]),
            [["unknown job kind: no_such_kind", true]]
          )
          const problems: Array<string> = []
          for (const a of all) {
            const errors = a.errors.map((e) => e.error)
            if (a.kind === "bad_backoff" || a.kind === "throwing_backoff") {
              if (
                a.state !== "completed" ||
                a.attempt !== 2 ||
                JSON.stringify(errors) !== '["first attempt fails"]'
              )
                problems.push(
                  `${a.kind} #${a.jobId}: ${a.state}, attempt ${a.attempt}, ${JSON.stringify(errors)}`
                )
            }
            if (a.kind === "bad_result") {
              if (
                a.state !== "completed" ||
                errors.length !== 1 ||
                !errors[0]!.startsWith("invalid handler outcome")
              )
                problems.push(`${a.kind} #${a.jobId}: ${a.state}, ${JSON.stringify(errors)}`)
            }
          }
          assert.deepStrictEqual(problems, [], `bad backoff and outcome values\n${dump(workers)}`)
          // nothing else affected: one attempt each
          for (const id of good) {
            const a = byId.get(id)!
            assert.strictEqual(a.state, "completed")
            assert.strictEqual(a.attempt, 1, `job ${id} was not affected: ${JSON.stringify(a.errors)}`)
          }
          // SQL-injection-shaped strings: stored and returned verbatim, harmless
          for (const id of injected) {
            const view = yield* storage.getJob(id)
            assert.strictEqual(view.kind, inj.kind)
            assert.strictEqual(view.queue, inj.queue)
            assert.deepStrictEqual(view.tags, inj.tags)
            const { "awa:traceparent": _producerSpan, ...metadata } = view.metadata
            assert.deepStrictEqual(metadata, inj.metadata)
            assert.deepStrictEqual(view.args, { s: inj.metadata.nested.a })
            assert.strictEqual(view.state, "completed")
          }
          const byTag = yield* storage.listJobs({ tag: inj.tags[1], limit: 1000 })
          assert.strictEqual(byTag.length, 25)
          const byQueue = yield* storage.listJobs({ queue: inj.queue, kind: inj.kind, limit: 1000 })
          assert.strictEqual(byQueue.length, 5)
          const logRows = yield* sql<{ n: number }>`SELECT count(*)::int AS n FROM fault_log`
          assert.isAbove(logRows[0]!.n, 300, "fault_log was not dropped or truncated")
          console.log(`[faults] rejected at enqueue:\n  ${rejections.join("\n  ")}`)
        })
      ),
    300_000
  )

  it.live(
    "7. stale writers: an attempt finishing after its job was rescued and re-claimed is rejected, the new attempt undisturbed",
    () =>
      onFreshDatabase((url) =>
        Effect.gen(function* () {
          const started = Date.now()
          const sql = yield* SqlClient.SqlClient
          const client = yield* AwaClient.AwaClient
          const storage = client.storage
          // A never leads and never heartbeats within the scenario (an attempt is heartbeated once
          // held half an interval, 5 min here): after it thaws, nothing tells it that its attempt
          // was closed, so it really sends its late completion. With a 10 s interval the first
          // round after the thaw was due at once, and the heartbeat thread (its own connection)
          // found the attempt closed and interrupted it before the completion went out.
          const [a] = yield* startWorkers(url, [
            {
              name: "a",
              options: {
                queues: { stale: { maxConcurrency: 1 } },
                heartbeatInterval: 600_000,
                heartbeatStaleness: 1_200_000,
                maintenance: false
              }
            }
          ])
          // Attempt 2 runs until the suite releases it, after the thawed worker's late write (and
          // its handler's end) was seen, however slowly the thaw goes: with a fixed 3 s a slow
          // thaw on a loaded machine let attempt 2 finish first.
          const [job] = yield* client.insertMany(Jobs.StaleWriter, [{ firstMs: 3000, maxMs: 240_000 }], {
            queue: "stale"
          })
          const jobId = job!.id
          const startedBy = (worker: string, lease: bigint) =>
            Effect.map(
              sql<{ n: number }>`
                SELECT count(*)::int AS n FROM fault_log
                WHERE job_id = ${jobId} AND run_lease = ${lease} AND worker = ${worker} AND event = 'start'`,
              (rows) => rows[0]!.n > 0
            )
          assert.isTrue(yield* eventually(startedBy("a", 1n), 10_000, 10), "a started attempt 1")
          // A freezes (a GC pause, a stopped VM) and its LISTEN connection is lost meanwhile, so the
          // rescue's cancel notification never reaches it.
          a!.child.kill("SIGSTOP")
          const frozenAt = Date.now()
          yield* sql`
            SELECT pg_terminate_backend(pid) FROM pg_stat_activity
            WHERE datname = current_database() AND application_name = 'awa-fault-a signals'`
          // B leads, rescues the silent attempt after the staleness and claims the retry
          const [b] = yield* startWorkers(url, [
            workerConfig("b", { stale: { maxConcurrency: 1 }, work: {} })
          ])
          const others = (yield* client.insertMany(
            Work,
            Array.from({ length: 50 }, (_, i) => ({ ms: i % 10 })),
            { queue: "work" }
          )).map((j) => j.id)
          assert.isTrue(
            yield* eventually(startedBy("b", 2n), 20_000, 10),
            `b claimed attempt 2\n${dump([a!, b!])}`
          )
          const reclaimedAt = Date.now()
          // A thaws: its handler finishes attempt 1 and it submits the completion
          a!.child.kill("SIGCONT")
          const lateWrite = yield* Effect.promise(() =>
            waitForEvent(a!, (e) => e.event === "stale" && e.jobId === String(jobId), 60_000)
          )
          assert.deepStrictEqual([lateWrite.runLease, lateWrite.outcome], ["1", "Complete"])
          const during = yield* storage.getJob(jobId)
          assert.strictEqual(during.state, "running", "the late completion did not finalize the job")
          assert.strictEqual(during.runLease, 2n)
          // every other write under the old lease is refused too, and changes nothing
          const old = { jobId, runLease: 1n }
          const refused = yield* storage.finalizeMany([
            { ...old, outcome: { _tag: "Complete" } },
            { ...old, outcome: { _tag: "Fail", error: "late failure" } },
            { ...old, outcome: { _tag: "Retry", delayMs: 0, error: "late retry" } },
            { ...old, outcome: { _tag: "Cancel", reason: "late cancel" } }
          ])
          assert.deepStrictEqual(
            refused.map((r) => r._tag),
            ["Stale", "Stale", "Stale", "Stale"]
          )
          assert.deepStrictEqual(yield* storage.heartbeatMany([{ ...old, progress: { late: true } }]), [old])
          const still = yield* storage.getJob(jobId)
          assert.deepStrictEqual(
            [still.state, still.runLease, still.attempt, still.errors.length, still.progress],
            ["running", 2n, 2, 1, null]
          )

          // A's handler has ended (its `end` is written before its completion is sent): attempt 2
          // may finish now
          yield* release([jobId])
          const drained = yield* eventually(
            Effect.map(unfinished, (n) => n === 0),
            30_000,
            100
          )
          const all = yield* accounts
          const ends = yield* sql<{ run_lease: bigint; worker: string }>`
            SELECT run_lease, worker FROM fault_log WHERE job_id = ${jobId} AND event = 'end' ORDER BY id`
          const staleEvents = [a!, b!].flatMap((w) => w.events.filter((e) => e.event === "stale")).length
          const { figures, lostJobs } = tally("stale writer", [jobId, ...others], all, {
            recoveryMs: reclaimedAt - frozenAt,
            wallMs: Date.now() - started,
            notes:
              `attempt 1 frozen (SIGSTOP) and rescued; attempt 2 claimed ${reclaimedAt - frozenAt} ms after the freeze; ` +
              `the thawed worker's late completion and 4 more writes under the old lease were refused as stale ` +
              `(${staleEvents} stale finalization(s) reported by workers); attempt 2 completed undisturbed`
          })
          yield* report("stale", figures)
          assert.isTrue(drained, `not drained\n${dump([a!, b!])}`)
          assert.deepStrictEqual(lostJobs, [], "lost jobs")
          const final = all.find((x) => x.jobId === jobId)!
          assert.deepStrictEqual(
            [final.state, final.attempt, final.runLease, final.errors.map((e) => e.error)],
            ["completed", 2, 2n, ["heartbeat stale: worker presumed dead"]]
          )
          assert.deepStrictEqual(
            final.runs.map((r) => [r.worker, r.runLease]),
            [
              ["a", 1n],
              ["b", 2n]
            ]
          )
          // both handlers finished: A's late, B's after it
          assert.deepStrictEqual(
            ends.map((e) => [e.worker, e.run_lease]),
            [
              ["a", 1n],
              ["b", 2n]
            ]
          )
          for (const id of others) assert.strictEqual(all.find((x) => x.jobId === id)!.attempt, 1)
        })
      ),
    300_000
  )
})
