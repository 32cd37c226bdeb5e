/**
 * The drain's server-side ceiling: how fast the server completes a backlog when the client costs
 * nothing. `pgbench` clients each loop over one `claim(batch)` and one `finalize_completions` of
 * what it returned, each its own transaction (as the runtime's hot connections run them), over a
 * backlog enqueued first with `insertMany`. With one client the two statements alternate; with
 * two, one client's claim overlaps the other's completion, as the runtime's claim-ahead and
 * completion batches do. Prints jobs/s and the server's CPU per 1,000 jobs (every Postgres
 * process, exited backends included), for reading a drain's figures against: Node's CPU per job
 * and what the server does beyond these two statements (docs/benchmarks.md, "The held attempts
 * in shared memory").
 *
 *   DATABASE_URL=postgres://…/postgres node --conditions=@awa/source bench/src/serverFloor.ts \
 *     [--jobs 100000] [--batch 200] [--clients 1,2]
 *
 * Needs `pgbench` (`PGBENCH`, Debian's, or on the PATH) and, for the CPU figure, a server on this
 * machine whose data directory the role may read (a superuser); without `DATABASE_URL`, an
 * embedded server with durability on.
 */
import { mkdtempSync, rmSync, writeFileSync } from "node:fs"
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
const clientCounts = stringArg("--clients", "1,2").split(",").map(Number)

/** One client's loop: claim, then complete what the claim returned (none: an empty completion). */
const script = `SELECT coalesce(array_agg(job_id)::text, '{}') AS ids, coalesce(array_agg(run_lease)::text, '{}') AS leases
  FROM awa.claim('${benchQueue}', ${batch}, 300000, 60000) \\gset
SELECT count(*) FROM awa.finalize_completions(':ids'::bigint[], ':leases'::bigint[]);
`

/** A database with Awa installed and `jobs` enqueued on the bench queue, analyzed and checkpointed. */
const backlog = (serverUrl: string) =>
  Effect.gen(function* () {
    const name = databaseName("server_floor")
    const url = yield* createDatabase(serverUrl, name)
    yield* Effect.addFinalizer(() => dropDatabase(serverUrl, name).pipe(Effect.ignore))
    yield* Effect.promise(async () => {
      const adapter = await (await factories.awa())(url, { profile: "tuned" })
      await adapter.install()
      for (let seq = 0; seq < jobs; seq += 1000)
        await adapter.enqueueBatch(Array.from({ length: Math.min(1000, jobs - seq) }, (_, i) => seq + i))
      await adapter.close()
    })
    yield* execute(url, "ANALYZE")
    yield* execute(url, "CHECKPOINT")
    return url
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

const program = Effect.gen(function* () {
  const pgbench = binary()
  if (pgbench === undefined) return yield* Console.error("pgbench not found (PGBENCH, Debian's, PATH)")
  const server = yield* acquireServer
  const pid = yield* postmasterPid(server.url, server.dataDir)
  const dir = mkdtempSync(join(tmpdir(), "awa-floor-"))
  yield* Effect.addFinalizer(() => Effect.sync(() => rmSync(dir, { recursive: true, force: true })))
  const file = join(dir, "floor.sql")
  writeFileSync(file, script)
  for (const clients of clientCounts) {
    yield* Effect.scoped(
      Effect.gen(function* () {
        const url = yield* backlog(server.url)
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
          "simple",
          "-t",
          String(perClient)
        ]
        yield* run(pgbench, [...args, "-f", file, url])
        const ms = performance.now() - t0
        const cpu1 = pid === undefined ? undefined : yield* settledCpu(server.url, url, pid)
        const done = perClient * clients * batch
        const cpu =
          cpu0 === undefined || cpu1 === undefined ? "n/a" : `${(((cpu1 - cpu0) * 1e6) / done).toFixed(1)} ms`
        yield* Console.log(
          `clients ${clients}, claim(${batch}) + finalize_completions: ${Math.round((done / ms) * 1000)} jobs/s, ` +
            `server CPU ${cpu} per 1,000 jobs (${done} jobs in ${Math.round(ms)} ms)`
        )
      })
    )
  }
})

Effect.runPromise(Effect.scoped(program)).catch((error) => {
  console.error(error)
  process.exitCode = 1
})
