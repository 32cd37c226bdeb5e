/**
 * The drain's server-side ceiling: how fast the server completes a backlog when the client costs
 * nothing. `pgbench` clients each loop over one claim of `--batch` jobs and one completion of what
 * it returned, each its own transaction (as the runtime's hot connections run them), over a
 * backlog enqueued first. With one client the two statements alternate; with two, one client's
 * claim overlaps the other's completion, as the runtime's claim-ahead and completion batches do.
 * Prints jobs/s and the server's CPU per 1,000 jobs (every Postgres process, exited backends and
 * autovacuum included), for reading a drain's figures against: Node's CPU per job and what the
 * server does beyond these two statements (docs/benchmarks.md, "The held attempts in shared
 * memory").
 *
 * `--systems` (default `awa`), each on a fresh database per run, the order rotating by round:
 *
 * - `awa`: `claim(batch)` and `finalize_completions` of its rows (the runtime's two hot calls);
 * - `graphile-worker`: its own fetch (the batched `get_job` query of its `getJobs.js`, strategy 2,
 *   with the dedupe step) and its batched completion (`DELETE … USING unnest`) over a backlog its
 *   `addJobs` enqueued;
 * - `minimal`: `floor/minimal.sql`, a lower bound for an append-only design with a claim record per
 *   call and a closure per job whose primary key is the completion's only guard, not a queue;
 * - `minimal-read`: the same with a completion that also reads each job's ready row (the price of a
 *   read by job id per completed job).
 *
 * All run prepared (`-M prepared`), as graphile-worker's own statements do.
 *
 *   DATABASE_URL=postgres://…/postgres node --conditions=@awa/source bench/src/serverFloor.ts \
 *     [--jobs 100000] [--batch 200] [--clients 1,2] [--systems awa,graphile-worker,minimal] [--rounds 1]
 *
 * Needs `pgbench` (`PGBENCH`, Debian's, or on the PATH) and, for the CPU figure, a server on this
 * machine whose data directory the role may read (a superuser); without `DATABASE_URL`, an
 * embedded server with durability on.
 */
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { Console, Effect } from "effect"
import { postmasterPid } from "./compare/observer.ts"
import { binary, run } from "./compare/pgbench.ts"
import { treeCpu } from "./compare/proc.ts"
import {
  acquireServer,
  createDatabase,
  databaseName,
  dropDatabase,
  execute,
  intArg,
  stringArg,
  withClient
} from "./lib.ts"
import { factories } from "./systems/factories.ts"
import { benchQueue } from "./systems/types.ts"

const jobs = intArg("--jobs", 100_000)
const batch = intArg("--batch", 200)
const rounds = intArg("--rounds", 1)
const clientCounts = stringArg("--clients", "1,2").split(",").map(Number)

type FloorSystem = "awa" | "graphile-worker" | "minimal" | "minimal-read"
const floorSystems: ReadonlyArray<FloorSystem> = ["awa", "graphile-worker", "minimal", "minimal-read"]
const systems = stringArg("--systems", "awa")
  .split(",")
  .map((name) => {
    if (!floorSystems.includes(name as FloorSystem))
      throw new Error(`--systems: unknown ${name} (${floorSystems.join(", ")})`)
    return name as FloorSystem
  })

/** Awa's loop: claim, then complete what the claim returned (none: an empty completion). */
const awaScript = `SELECT coalesce(array_agg(job_id)::text, '{}') AS ids, coalesce(array_agg(run_lease)::text, '{}') AS leases
  FROM awa.claim('${benchQueue}', ${batch}, 300000, 60000) \\gset
SELECT count(*) FROM awa.finalize_completions(:ids::bigint[], :leases::bigint[]);
`

/** The same loop over `floor/minimal.sql`'s functions (`finalize` names the completion). */
const minimalScript = (
  finalize: string
) => `SELECT coalesce(array_agg(job_id)::text, '{}') AS ids, coalesce(array_agg(run_lease)::text, '{}') AS leases
  FROM claim('${benchQueue}', ${batch}, 300000) \\gset
SELECT count(*) FROM ${finalize}(:ids::bigint[], :leases::bigint[]);
`

/**
 * graphile-worker 0.18's fetch as its `getJobs.js` builds it for a batch (strategy 2: jobs outside
 * a named queue, or in one whose row this call locks; then one job per named queue), for the
 * bench's task, and its completion of jobs outside a named queue (`completeJobs.js`). The fetch's
 * updated rows are aggregated, not sent, as Awa's claimed rows are above.
 */
const graphileScript = (taskId: number) => `WITH j_raw AS (
  SELECT jobs.job_queue_id, jobs.priority, jobs.run_at, jobs.id
    FROM graphile_worker._private_jobs AS jobs
    WHERE jobs.is_available = true AND run_at <= now() AND task_id = any('{${taskId}}'::int[])
      AND (jobs.job_queue_id IS NULL OR jobs.job_queue_id IN (
        SELECT id FROM graphile_worker._private_job_queues AS job_queues
        WHERE job_queues.is_available = true FOR UPDATE SKIP LOCKED))
    ORDER BY priority ASC, run_at ASC LIMIT ${batch} FOR UPDATE SKIP LOCKED
), j AS (
  SELECT DISTINCT ON (job_queue_id, CASE WHEN job_queue_id IS NULL THEN id END) job_queue_id, priority, run_at, id
    FROM j_raw ORDER BY job_queue_id, CASE WHEN job_queue_id IS NULL THEN id END, priority ASC, run_at ASC
), q AS (
  UPDATE graphile_worker._private_job_queues AS job_queues SET locked_by = 'floor', locked_at = now()
    FROM j WHERE job_queues.id = j.job_queue_id
), u AS (
  UPDATE graphile_worker._private_jobs AS jobs SET attempts = jobs.attempts + 1, locked_by = 'floor', locked_at = now()
    FROM j WHERE jobs.id = j.id RETURNING jobs.*
)
SELECT coalesce(array_agg(u.id)::text, '{}') AS ids FROM u \\gset
DELETE FROM graphile_worker._private_jobs AS jobs USING unnest(:ids::bigint[]) n(n) WHERE id = n;
`

/** `jobs` enqueued by the system's own batch insert, 1,000 at a time. */
const enqueueWith = (system: "awa" | "graphile-worker", url: string) =>
  Effect.promise(async () => {
    const adapter = await (await factories[system]())(url, { profile: "tuned" })
    await adapter.install()
    for (let seq = 0; seq < jobs; seq += 1000)
      await adapter.enqueueBatch(Array.from({ length: Math.min(1000, jobs - seq) }, (_, i) => seq + i))
    await adapter.close()
  })

/** A database with the system installed and `jobs` queued, analyzed and checkpointed; its loop's script. */
const backlog = (serverUrl: string, system: FloorSystem) =>
  Effect.gen(function* () {
    const name = databaseName("server_floor")
    const url = yield* createDatabase(serverUrl, name)
    yield* Effect.addFinalizer(() => dropDatabase(serverUrl, name).pipe(Effect.ignore))
    let script: string
    if (system === "minimal" || system === "minimal-read") {
      // one statement per call: a statement ends before a blank line, or a line starting another one
      const file = readFileSync(join(import.meta.dirname, "floor", "minimal.sql"), "utf8")
      for (const statement of file.split(/;\n(?=\n|CREATE |--)/)) yield* execute(url, statement)
      yield* execute(
        url,
        `INSERT INTO ready (job_id, kind, queue, priority, lane_seq, args)
         SELECT g, 'bench', '${benchQueue}', 2, g, jsonb_build_object('seq', g) FROM generate_series(1, ${jobs}) g`
      )
      script = minimalScript(system === "minimal" ? "finalize_completions" : "finalize_completions_read")
    } else {
      yield* enqueueWith(system, url)
      if (system === "awa") script = awaScript
      else {
        const rows = yield* withClient(
          url,
          (sql) =>
            sql<{
              id: number
            }>`SELECT id FROM graphile_worker._private_tasks WHERE identifier = ${benchQueue}`
        )
        script = graphileScript(rows[0]!.id)
      }
    }
    yield* execute(url, "ANALYZE")
    yield* execute(url, "CHECKPOINT")
    return { url, script }
  })

/**
 * The server's CPU once the clients' backends are gone: an exited backend's time reaches the
 * postmaster's reaped-children sum only when the postmaster has reaped it, so wait until the
 * database has no backend left and two readings 20 ms apart agree (at most 2 s).
 */
const settledCpu = (serverUrl: string, dbUrl: string, pid: number) =>
  Effect.gen(function* () {
    const name = new URL(dbUrl).pathname.slice(1)
    for (let i = 0; i < 100; i++) {
      const rows = yield* withClient(
        serverUrl,
        (sql) => sql<{ n: number }>`SELECT count(*)::int AS n FROM pg_stat_activity WHERE datname = ${name}`
      )
      if (rows[0]!.n === 0) break
      yield* Effect.sleep(20)
    }
    let last = treeCpu(pid)
    for (let i = 0; i < 100; i++) {
      yield* Effect.sleep(20)
      const now = treeCpu(pid)
      if (now === last) break
      last = now
    }
    return last
  })

/** Milliseconds of CPU per 1,000 jobs, from two `treeCpu` readings (seconds) around `done` jobs. */
const perThousandJobs = (before: number, after: number, done: number) =>
  (((after - before) * 1e6) / done).toFixed(1)

interface FloorContext {
  readonly pgbench: string
  readonly serverUrl: string
  readonly pid: number | undefined
  readonly dir: string
}

/** One system's loop with `clients` clients over a fresh backlog; prints its line. */
const measureOnce = (ctx: FloorContext, system: FloorSystem, clients: number, round: number) =>
  Effect.gen(function* () {
    const { pgbench, serverUrl, pid, dir } = ctx
    const { url, script } = yield* backlog(serverUrl, system)
    const file = join(dir, `${system}.sql`)
    writeFileSync(file, script)
    // every client stops short of the end of the backlog: each call claims a full batch
    const perClient = Math.floor(jobs / batch / clients) - 5
    const cpu0 = pid === undefined ? undefined : treeCpu(pid)
    const t0 = performance.now()
    const args = [
      "-n",
      "-c",
      String(clients),
      "-j",
      String(clients),
      "-M",
      "prepared",
      "-t",
      String(perClient)
    ]
    yield* run(pgbench, [...args, "-f", file, url])
    const ms = performance.now() - t0
    const cpu1 = pid === undefined ? undefined : yield* settledCpu(serverUrl, url, pid)
    const done = perClient * clients * batch
    const cpu = cpu0 === undefined || cpu1 === undefined ? "n/a" : `${perThousandJobs(cpu0, cpu1, done)} ms`
    // graphile-worker's updates and deletes leave dead tuples that (auto)vacuum removes later:
    // its cost, measured the same way, is printed beside the loop's
    let vacuum = ""
    if (system === "graphile-worker" && pid !== undefined && cpu1 !== undefined) {
      yield* execute(url, "VACUUM graphile_worker._private_jobs")
      const cpu2 = yield* settledCpu(serverUrl, url, pid)
      if (cpu2 !== undefined)
        vacuum = `; then VACUUM of its table ${perThousandJobs(cpu1, cpu2, done)} ms per 1,000 jobs`
    }
    yield* Console.log(
      `round ${round + 1}, ${system.padEnd(15)} clients ${clients}, batch ${batch}: ` +
        `${Math.round((done / ms) * 1000)} jobs/s, server CPU ${cpu} per 1,000 jobs (${done} jobs in ${Math.round(ms)} ms)${vacuum}`
    )
  }).pipe(Effect.scoped)

const program = Effect.gen(function* () {
  const pgbench = binary()
  if (pgbench === undefined) return yield* Console.error("pgbench not found (PGBENCH, Debian's, PATH)")
  const server = yield* acquireServer
  const pid = yield* postmasterPid(server.url, server.dataDir)
  const dir = mkdtempSync(join(tmpdir(), "awa-floor-"))
  yield* Effect.addFinalizer(() => Effect.sync(() => rmSync(dir, { recursive: true, force: true })))
  const ctx: FloorContext = { pgbench, serverUrl: server.url, pid, dir }
  // the systems' order rotates by round: none always runs first, on a colder machine
  for (let round = 0; round < rounds; round++)
    for (const clients of clientCounts)
      for (let k = 0; k < systems.length; k++)
        yield* measureOnce(ctx, systems[(k + round) % systems.length]!, clients, round)
})

Effect.runPromise(Effect.scoped(program)).catch((error) => {
  console.error(error)
  process.exitCode = 1
})
