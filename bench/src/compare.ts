/**
 * Awa side by side with graphile-worker and pg-boss (issue 5): the same workloads against each
 * system, each in its own database and its own Node child process, on one Postgres.
 *
 *   npm run bench                              # full run: 3 min on a quiet machine, ~7 min when busy
 *   npm run bench -- --quick                   # short version, about 1.5–2 minutes
 *   npm run bench -- --systems awa,pg-boss --phases drain,latency
 *   npm run bench -- --cpu-prof awa            # V8 CPU profile of the Awa child per phase
 *   DATABASE_URL=… npm run bench -- --statements   # top pg_stat_statements per phase (server
 *                                              # started with shared_preload_libraries=pg_stat_statements)
 *   npm run bench -- --soak 10m --pinned-reader   # steady load per system, see compare/soak.ts
 *
 * Postgres: `DATABASE_URL` when set (a superuser, for CHECKPOINT and CREATE DATABASE … TEMPLATE),
 * otherwise a temporary embedded PostgreSQL with durability ON, stopped and deleted on exit.
 *
 * Per system, a template database is created and the system installs itself there (migrations,
 * queue). Each phase then runs in a fresh clone of the template and a fresh child process,
 * systems in rotating order per phase (so a change of machine load does not always hit the same
 * system). See `compare/phases.ts` for the workloads and the run hygiene.
 *
 * Output: tables on stdout, and `bench/results/compare-<timestamp>.json` plus
 * `bench/results/latest.json` with one object per system (`systems`), the ratios to the best peer
 * (`comparison`) and every phase's details (`phases`).
 */
import { execFileSync } from "node:child_process"
import { mkdirSync, writeFileSync } from "node:fs"
import os from "node:os"
import { fileURLToPath } from "node:url"
import { NodeRuntime } from "@effect/platform-node"
import { Console, Effect } from "effect"
import { type Child, spawnChild } from "./compare/childProcess.ts"
import { enableStatements, postmasterPid, serverSettings } from "./compare/observer.ts"
import {
  drain,
  enqueueBatch,
  enqueueBulk,
  enqueueOne,
  fullSizes,
  type Hygiene,
  latency,
  type PhaseContext,
  type PhaseName,
  type PhaseResult,
  phaseNames,
  quickSizes
} from "./compare/phases.ts"
import { loadAverage } from "./compare/proc.ts"
import type { Description } from "./compare/protocol.ts"
import {
  compare,
  renderDrainTables,
  renderLatency,
  renderPhases,
  renderStatements,
  renderSummary,
  type SystemSummary,
  summarize
} from "./compare/report.ts"
import { runSoak } from "./compare/soak.ts"
import { acquireServer, createDatabase, databaseName, dropDatabase, round } from "./lib.ts"
import { type SystemName, systemNames } from "./systems/types.ts"

const resultsDir = fileURLToPath(new URL("../results/", import.meta.url))

// ---------------------------------------------------------------------------------------------
// Arguments

interface Options {
  readonly quick: boolean
  readonly systems: ReadonlyArray<SystemName>
  readonly phases: ReadonlyArray<PhaseName>
  readonly cpuProf: ReadonlyArray<SystemName>
  readonly hygiene: Hygiene
  readonly soak:
    | { readonly durationMs: number; readonly pinnedReader: boolean; readonly rate: number }
    | undefined
  readonly statements: boolean
}

const parseDuration = (text: string): number => {
  const m = /^(\d+(?:\.\d+)?)(ms|s|m|h)?$/.exec(text)
  if (m === null) throw new Error(`not a duration: ${text} (e.g. 90s, 10m, 1h)`)
  const unit = { ms: 1, s: 1000, m: 60_000, h: 3_600_000 }[(m[2] ?? "s") as "ms" | "s" | "m" | "h"]
  return Number(m[1]) * unit
}

const parseArgs = (argv: ReadonlyArray<string>): Options => {
  const value = (flag: string) => {
    const i = argv.indexOf(flag)
    return i === -1 ? undefined : argv[i + 1]
  }
  const list = <A extends string>(flag: string, all: ReadonlyArray<A>): ReadonlyArray<A> => {
    const v = value(flag)
    if (v === undefined) return all
    const items = v.split(",") as Array<A>
    for (const item of items)
      if (!all.includes(item)) throw new Error(`${flag}: unknown ${item} (${all.join(", ")})`)
    return all.filter((a) => items.includes(a))
  }
  const quick = argv.includes("--quick")
  const soak = value("--soak")
  const cpuProf = value("--cpu-prof")
  return {
    quick,
    systems: list("--systems", systemNames),
    phases: list("--phases", phaseNames),
    cpuProf: cpuProf === undefined ? [] : list("--cpu-prof", systemNames),
    hygiene: {
      maxOtherCores: Number(value("--max-other-cores") ?? 0.5),
      maxQuietWaitMs: parseDuration(value("--max-quiet-wait") ?? (quick ? "3s" : "20s"))
    },
    soak:
      soak === undefined
        ? undefined
        : {
            durationMs: parseDuration(soak),
            pinnedReader: argv.includes("--pinned-reader"),
            rate: Number(value("--rate") ?? 200)
          },
    statements: argv.includes("--statements")
  }
}

// ---------------------------------------------------------------------------------------------
// Databases

/** CREATE DATABASE … TEMPLATE fails while a backend of the template is still exiting: retry. */
const retryingClone = (serverUrl: string, name: string, template: string) =>
  Effect.gen(function* () {
    for (let attempt = 1; ; attempt++) {
      const result = yield* Effect.result(createDatabase(serverUrl, name, template))
      if (result._tag === "Success") return result.success
      if (attempt >= 40) return yield* Effect.fail(result.failure)
      yield* Effect.sleep(250)
    }
  })

const gitDescription = () => {
  try {
    const cwd = fileURLToPath(new URL("../..", import.meta.url))
    const commit = execFileSync("git", ["rev-parse", "--short", "HEAD"], { cwd, encoding: "utf8" }).trim()
    const dirty = execFileSync("git", ["status", "--porcelain", "packages"], { cwd, encoding: "utf8" }).trim()
    return { commit, packagesModified: dirty === "" ? [] : dirty.split("\n").map((l) => l.trim()) }
  } catch {
    return { commit: "unknown", packagesModified: [] }
  }
}

// ---------------------------------------------------------------------------------------------
// Main

const program = Effect.gen(function* () {
  const options = parseArgs(process.argv.slice(2))
  const sizes = options.quick ? quickSizes : fullSizes
  const startedAt = new Date()
  const stamp = startedAt.toISOString().replace(/[:.]/g, "-")
  const loadBefore = loadAverage()
  const server = yield* acquireServer
  const pgPid = yield* postmasterPid(server.url, server.dataDir)
  const settings = yield* serverSettings(server.url)
  const statements = options.statements && (yield* enableStatements(server.url))
  if (options.statements && !statements)
    yield* Console.error("--statements: pg_stat_statements is not preloaded on this server; ignored")
  yield* Console.log(
    `compare: ${options.systems.join(", ")} on PostgreSQL ${settings.server_version} ` +
      `(${server.started ? "embedded, durable" : "DATABASE_URL"}); ${options.quick ? "quick" : "full"} run; ` +
      `load ${loadBefore.join(" ")}`
  )

  // One template database per system, installed by the system itself.
  const templates = new Map<SystemName, string>()
  const descriptions = new Map<SystemName, Description>()
  yield* Effect.addFinalizer(() =>
    Effect.forEach([...templates.values()], (name) => dropDatabase(server.url, name), { discard: true })
  )
  for (const system of options.systems) {
    const name = databaseName(`bench_tpl_${system.replace("-", "")}`)
    const url = yield* createDatabase(server.url, name)
    templates.set(system, name)
    yield* Effect.scoped(
      Effect.gen(function* () {
        const child = yield* spawnChild(system, url)
        yield* child.call({ op: "install" }, 120_000)
        descriptions.set(system, yield* child.call<Description>({ op: "describe" }, 10_000))
      })
    )
  }

  if (options.soak !== undefined) {
    return yield* runSoak({
      serverUrl: server.url,
      templates,
      descriptions,
      systems: options.systems,
      rate: options.soak.rate,
      durationMs: options.soak.durationMs,
      pinnedReader: options.soak.pinnedReader,
      postmasterPid: pgPid,
      resultsDir,
      stamp,
      clone: (name, template) => retryingClone(server.url, name, template)
    })
  }

  const results: Array<PhaseResult> = []
  const errors = new Map<SystemName, Array<string>>(options.systems.map((s) => [s, []]))
  for (const [index, phase] of options.phases.entries()) {
    // rotate the order of systems from phase to phase
    const order = options.systems.map((_, i) => options.systems[(i + index) % options.systems.length]!)
    for (const system of order) {
      const name = databaseName(`bench_${phase.replace("-", "_")}_${system.replace("-", "")}`)
      const run = Effect.gen(function* () {
        const dbUrl = yield* retryingClone(server.url, name, templates.get(system)!)
        const execArgv = options.cpuProf.includes(system)
          ? [
              "--cpu-prof",
              "--cpu-prof-dir",
              resultsDir,
              "--cpu-prof-name",
              `profile-${stamp}-${system}-${phase}.json`
            ]
          : []
        const child: Child = yield* spawnChild(system, dbUrl, { execArgv })
        const ctx: PhaseContext = {
          child,
          serverUrl: server.url,
          dbUrl,
          postmasterPid: pgPid,
          sizes,
          hygiene: options.hygiene,
          statements
        }
        const closeChild = Effect.ignore(child.call({ op: "close" }, 60_000)).pipe(
          Effect.andThen(Effect.sleep(200))
        )
        switch (phase) {
          case "enqueue-one":
            return yield* enqueueOne(ctx)
          case "enqueue-batch":
            return yield* enqueueBatch(ctx)
          case "enqueue-bulk":
            return yield* enqueueBulk(ctx)
          case "drain":
            return yield* drain(ctx, closeChild)
          case "latency":
            return yield* latency(ctx)
        }
      }).pipe(Effect.scoped, Effect.ensuring(Effect.suspend(() => dropDatabase(server.url, name))))
      const outcome = yield* Effect.result(run)
      if (outcome._tag === "Success") {
        const r: PhaseResult = outcome.success
        results.push(r)
        const extra =
          r.latency !== undefined
            ? `p50 ${r.latency.pickup.p50} / p95 ${r.latency.pickup.p95} / p99 ${r.latency.pickup.p99} ms`
            : `${r.jobsPerSec.toLocaleString("en-US")} jobs/s`
        yield* Console.log(
          `  ${phase.padEnd(13)} ${system.padEnd(15)} ${extra}, ${r.walBytesPerJob} B WAL/job, ` +
            `other cores ${r.quiet.otherCores ?? "n/a"} → ${r.otherCoresDuring ?? "n/a"}, ${r.correctness.detail}`
        )
      } else {
        const message = String(outcome.failure instanceof Error ? outcome.failure.message : outcome.failure)
        errors.get(system)!.push(`${phase}: ${message.split("\n")[0]}`)
        yield* Console.error(`  ${phase.padEnd(13)} ${system.padEnd(15)} FAILED: ${message}`)
      }
    }
  }

  const summaries: Array<SystemSummary> = options.systems.map((system) =>
    summarize(system, descriptions.get(system)!, results, errors.get(system)!)
  )
  const cpus = os.cpus()
  const report = {
    startedAt: startedAt.toISOString(),
    command: `npm run bench --${process.argv.slice(2).length > 0 ? ` ${process.argv.slice(2).join(" ")}` : ""}`,
    mode: options.quick ? "quick" : "full",
    sizes,
    hygiene: options.hygiene,
    git: gitDescription(),
    database: server.started ? "embedded (durable)" : "DATABASE_URL",
    machine: {
      cpus: cpus.length,
      cpuModel: cpus[0]?.model ?? "unknown",
      memGiB: round(os.totalmem() / 2 ** 30, 1),
      node: process.version,
      loadBefore,
      loadAfter: loadAverage()
    },
    postgres: settings,
    systems: summaries,
    comparison: compare(summaries),
    phases: results
  }
  yield* Console.log(
    [
      "",
      renderSummary(summaries),
      "",
      "Phases (other cores: CPU used by other processes on the machine, before / during the interval):",
      renderPhases(results),
      "",
      "Pickup latency (ms; handler start minus the producer's return from the committed insert):",
      renderLatency(results),
      "",
      renderDrainTables(results),
      ...(statements ? ["", renderStatements(results)] : [])
    ].join("\n")
  )
  mkdirSync(resultsDir, { recursive: true })
  const file = `${resultsDir}compare-${stamp}.json`
  const json = `${JSON.stringify(report, null, 2)}\n`
  writeFileSync(file, json)
  writeFileSync(`${resultsDir}latest.json`, json)
  yield* Console.log(`\nwritten ${file} and ${resultsDir}latest.json`)
}).pipe(Effect.scoped)

NodeRuntime.runMain(program)
