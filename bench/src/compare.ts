/**
 * Awa side by side with graphile-worker and pg-boss (issue 5): the same workloads against each
 * system, each in its own database and its own Node child process, on one Postgres.
 *
 *   npm run bench                              # full run (time: docs/benchmarks.md)
 *   npm run bench -- --quick                   # short version, under 10 minutes
 *   npm run bench -- --systems awa,pg-boss --phases drain,latency
 *   npm run bench -- --server postgres://u@host:5432/postgres   # any PostgreSQL (role with CREATEDB)
 *   npm run bench -- --profile defaults        # Awa as configured by default (see systems/awa.ts)
 *   npm run bench -- --phases scale,enqueue-one-8,enqueue-one-8q   # issue 17's scale-out figures
 *   npm run bench -- --help
 *   npm run bench -- --cpu-prof awa            # V8 CPU profile of the Awa child per phase
 *   DATABASE_URL=… npm run bench -- --statements   # top pg_stat_statements per phase (server
 *                                              # started with shared_preload_libraries=pg_stat_statements)
 *   npm run bench -- --soak 10m --pinned-reader   # steady load per system, see compare/soak.ts
 *
 * Postgres: `--server <url>`, else `DATABASE_URL` when set (a role with CREATEDB; a superuser or
 * pg_checkpoint member for CHECKPOINT before each phase), otherwise a temporary embedded
 * PostgreSQL with durability ON, stopped and deleted on exit. The server's description (version,
 * JIT, key settings, embedded or external) is printed first and recorded with the run and with
 * every phase's result.
 *
 * Per system, a template database is created and the system installs itself there (migrations,
 * queue). Each phase then runs in a fresh clone of the template and a fresh child process,
 * systems in rotating order per phase (so a change of machine load does not always hit the same
 * system). See `compare/phases.ts` for the workloads and the run hygiene.
 *
 * Awa runs in one or more profiles (`--profile`, see `systems/types.ts`): results name the tuned
 * one `awa`, the others `awa-<profile>` (`awa-defaults`, `awa-lean`); each has a `profile` field.
 *
 * Output: tables on stdout, and `bench/results/compare-<timestamp>.json` plus
 * `bench/results/latest.json` with one object per entrant (`systems`), the ratios to the best peer
 * (`comparison` for the first Awa profile, `comparisons` per profile), the server (`server`) and
 * every phase's details (`phases`).
 */
import { execFileSync } from "node:child_process"
import { mkdirSync, writeFileSync } from "node:fs"
import os from "node:os"
import { fileURLToPath } from "node:url"
import { NodeRuntime } from "@effect/platform-node"
import { Console, Effect } from "effect"
import { type Child, spawnChild } from "./compare/childProcess.ts"
import { enableStatements, postmasterPid, renderServer, serverDescription } from "./compare/observer.ts"
import { type RawInsert, rawInsert } from "./compare/pgbench.ts"
import {
  drain,
  enqueueBatch,
  enqueueBulk,
  enqueueConcurrent,
  enqueueOne,
  fullSizes,
  type Hygiene,
  latency,
  type PhaseContext,
  type PhaseName,
  type PhaseResult,
  phaseNames,
  quickSizes,
  scale,
  scaleProcesses
} from "./compare/phases.ts"
import { loadAverage } from "./compare/proc.ts"
import type { Description } from "./compare/protocol.ts"
import {
  compare,
  ratiosByRound,
  renderDrainTables,
  renderLatency,
  renderPhases,
  renderRounds,
  renderStatements,
  renderSummary,
  type SystemSummary,
  summarize
} from "./compare/report.ts"
import { runSoak } from "./compare/soak.ts"
import { acquireServerAt, createDatabase, databaseName, dropDatabase, round } from "./lib.ts"
import { defaultProfiles, type Profile, profiles, type SystemName, systemNames } from "./systems/types.ts"

const resultsDir = fileURLToPath(new URL("../results/", import.meta.url))

// ---------------------------------------------------------------------------------------------
// Arguments

interface Options {
  readonly quick: boolean
  /** `--server`: the PostgreSQL to run on, instead of `DATABASE_URL` or an embedded one. */
  readonly server: string | undefined
  readonly systems: ReadonlyArray<SystemName>
  /** Awa's profiles, tuned first. */
  readonly profiles: ReadonlyArray<Profile>
  readonly phases: ReadonlyArray<PhaseName>
  readonly cpuProf: ReadonlyArray<SystemName>
  readonly hygiene: Hygiene
  readonly soak:
    | { readonly durationMs: number; readonly pinnedReader: boolean; readonly rate: number }
    | undefined
  readonly statements: boolean
  /** Measure the server's raw multi-row INSERT rate with pgbench (with the enqueue-batch phase). */
  readonly pgbench: boolean
  /** `--drain` / `--drain-warm`: the drain phase's backlog and warm-up, instead of the mode's sizes. */
  readonly drain: { readonly jobs: number | undefined; readonly warm: number | undefined }
  /** `--enqueue-one` / `--enqueue-one-warm`: the enqueue-one phase's inserts and warm-up. */
  readonly enqueueOne: { readonly jobs: number | undefined; readonly warm: number | undefined }
  /** `--enqueue-batch` / `--enqueue-batch-warm`: the chunks phase's jobs and warm-up (in chunks). */
  readonly enqueueBatch: { readonly jobs: number | undefined; readonly warm: number | undefined }
  /** `--rounds`: every phase this many times, the entrants interleaved; figures are medians. */
  readonly rounds: number
}

const parseDuration = (text: string): number => {
  const m = /^(\d+(?:\.\d+)?)(ms|s|m|h)?$/.exec(text)
  if (m === null) throw new Error(`not a duration: ${text} (e.g. 90s, 10m, 1h)`)
  const unit = { ms: 1, s: 1000, m: 60_000, h: 3_600_000 }[(m[2] ?? "s") as "ms" | "s" | "m" | "h"]
  return Number(m[1]) * unit
}

const help = `npm run bench -- [options]   (Awa, graphile-worker and pg-boss side by side; docs/benchmarks.md)

  --quick                   smaller sizes, under 10 minutes
  --server <url>            run on this PostgreSQL (e.g. postgres://user@host:5432/postgres): the
                            role needs CREATEDB (a superuser, or pg_checkpoint, also gets a CHECKPOINT
                            before each phase); otherwise DATABASE_URL, otherwise an embedded
                            PostgreSQL 17 with durability on, deleted on exit
  --systems <list>          ${systemNames.join(",")} (default: all)
  --phases <list>           ${phaseNames.join(",")} (default: all)
  --profile <list>          Awa's profiles: tuned (tracing off; results "awa"), defaults (only
                            maxConcurrency set; results "awa-defaults"), lean (tuned keeping no
                            completed job, as graphile-worker; results "awa-lean"); default:
                            tuned,defaults (quick: tuned)
  --cpu-prof <systems>      V8 CPU profile of those systems' children, per phase
  --statements              top pg_stat_statements per phase (server preloads it)
  --drain <n> --drain-warm <n>   the drain phase's backlog and the warm-up drained before it (default
                            20,000 and 1,000; quick 5,000 and 500). A steady drain, for example
                            --drain 150000 --drain-warm 20000: V8 has compiled the hot path, and the
                            rings rotate and prune inside the measured interval
  --enqueue-one <n> --enqueue-one-warm <n>   the enqueue-one phase's inserts and the warm-up before
                            them (default 2,000 and 200; quick 500 and 100). With a warm-up of a few
                            thousand, V8 has compiled each system's insert path
  --enqueue-batch <n> --enqueue-batch-warm <n>   the chunks phase's jobs and the warm-up before them,
                            both in chunks of 1,000 (default 20,000 and 2,000; quick 5,000 and 1,000)
  --rounds <n>              every phase n times (1–20, default 1), the systems interleaved in each:
                            the summary takes each figure's median over the rounds, and prints
                            Awa's ratio to the best peer round by round (this machine moves every
                            system's rate up to 2× between minutes: a ratio is read within a round)
  --no-pgbench              skip the raw multi-row INSERT rate (pgbench, 1,000 rows per statement)
                            measured after the phases when enqueue-batch is among them
  --max-other-cores <n>     start a phase once other processes use fewer cores (default 0.5)
  --max-quiet-wait <dur>    …or after this long (default 20s, quick 3s)
  --soak <dur> [--rate n] [--pinned-reader]   steady load per system instead (compare/soak.ts)
  --help                    this text`

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
  const count = (flag: string) => {
    const v = value(flag)
    if (v === undefined) return undefined
    const n = Number(v)
    const min = flag.endsWith("-warm") ? 0 : 1
    if (!Number.isInteger(n) || n < min || n > 10_000_000)
      throw new Error(`${flag}: an integer ${min}–10,000,000, not ${v}`)
    return n
  }
  const quick = argv.includes("--quick")
  const soak = value("--soak")
  const cpuProf = value("--cpu-prof")
  const server = value("--server")
  if (argv.includes("--server") && (server === undefined || server.startsWith("--")))
    throw new Error("--server needs a URL, e.g. postgres://user@host:5432/postgres")
  return {
    quick,
    server,
    systems: list("--systems", systemNames),
    // both profiles cost a fourth entrant: a third more time, too much for quick mode (ADR 0025)
    profiles:
      value("--profile") === undefined ? (quick ? ["tuned"] : defaultProfiles) : list("--profile", profiles),
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
    statements: argv.includes("--statements"),
    pgbench: !argv.includes("--no-pgbench"),
    drain: { jobs: count("--drain"), warm: count("--drain-warm") },
    enqueueOne: { jobs: count("--enqueue-one"), warm: count("--enqueue-one-warm") },
    enqueueBatch: { jobs: count("--enqueue-batch"), warm: count("--enqueue-batch-warm") },
    rounds: parseRounds(value("--rounds"))
  }
}

const parseRounds = (text: string | undefined): number => {
  if (text === undefined) return 1
  const n = Number(text)
  if (!Number.isInteger(n) || n < 1 || n > 20) throw new Error(`--rounds: an integer 1–20, not ${text}`)
  return n
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

/** One column of the comparison: a system, and for Awa one of its profiles. */
interface Entrant {
  readonly system: SystemName
  readonly profile: Profile | undefined
  /** Name in results: the system, or `awa-defaults`. */
  readonly label: string
}

const entrantsOf = (options: Options): ReadonlyArray<Entrant> =>
  options.systems.flatMap(
    (system): Array<Entrant> =>
      system === "awa"
        ? options.profiles.map((profile) => ({
            system,
            profile,
            label: profile === "tuned" ? "awa" : `awa-${profile}`
          }))
        : [{ system, profile: undefined, label: system }]
  )

const runPhase = (
  phase: PhaseName,
  ctx: PhaseContext,
  closeChild: Effect.Effect<void>,
  processes: number
) => {
  switch (phase) {
    case "enqueue-one":
      return enqueueOne(ctx)
    case "enqueue-one-8":
    case "enqueue-one-8q":
      return enqueueConcurrent(ctx, phase)
    case "enqueue-batch":
      return enqueueBatch(ctx)
    case "enqueue-bulk":
      return enqueueBulk(ctx)
    case "drain":
      return drain(ctx, closeChild)
    case "scale":
      return scale(ctx, processes)
    case "latency":
      return latency(ctx)
  }
}

const renderRawInsert = (
  raw: RawInsert | { readonly error: string },
  summaries: ReadonlyArray<SystemSummary>
): string => {
  if ("error" in raw) return `Raw multi-row INSERT (pgbench): FAILED ${raw.error.split("\n")[0]}`
  const ratios = summaries
    .filter((s) => s.enqueueBatchPerSec !== null)
    .map((s) => `${s.system} ${Math.round((100 * s.enqueueBatchPerSec!) / raw.rowsPerSec)} %`)
  return (
    `Raw multi-row INSERT (${raw.pgbench}, 1 client, ${raw.rowsPerStatement.toLocaleString("en-US")} rows per ` +
    `statement, ${raw.seconds} s): ${raw.rowsPerSec.toLocaleString("en-US")} rows/s, ${raw.walBytesPerRow} B WAL/row, ` +
    `Postgres CPU ${raw.postgresCpuMsPer1000Rows ?? "n/a"} ms / 1,000 rows\n  enqueue in chunks of 1,000 as a share of it: ${ratios.join(", ")}`
  )
}

/** The child's environment: Awa's profile. */
const childEnv = (e: Entrant) => (e.profile === undefined ? undefined : { AWA_BENCH_PROFILE: e.profile })

const program = Effect.gen(function* () {
  if (process.argv.includes("--help")) return yield* Console.log(help)
  const options = parseArgs(process.argv.slice(2))
  const entrants = entrantsOf(options)
  const modeSizes = options.quick ? quickSizes : fullSizes
  const sizes = {
    ...modeSizes,
    drain: options.drain.jobs ?? modeSizes.drain,
    drainWarm: options.drain.warm ?? modeSizes.drainWarm,
    enqueueOne: options.enqueueOne.jobs ?? modeSizes.enqueueOne,
    enqueueOneWarm: options.enqueueOne.warm ?? modeSizes.enqueueOneWarm,
    enqueueBatch: options.enqueueBatch.jobs ?? modeSizes.enqueueBatch,
    enqueueBatchWarm: options.enqueueBatch.warm ?? modeSizes.enqueueBatchWarm
  }
  const startedAt = new Date()
  const stamp = startedAt.toISOString().replace(/[:.]/g, "-")
  const loadBefore = loadAverage()
  const server = yield* acquireServerAt(options.server)
  const pgPid = yield* postmasterPid(server.url, server.dataDir)
  const described = yield* serverDescription(server.url, server.started ? "embedded" : "external")
  const statements = options.statements && (yield* enableStatements(server.url))
  if (options.statements && !statements)
    yield* Console.error("--statements: pg_stat_statements is not preloaded on this server; ignored")
  const source = server.started
    ? "embedded, durable"
    : options.server !== undefined
      ? "--server"
      : "DATABASE_URL"
  yield* Console.log(
    `compare: ${entrants.map((e) => e.label).join(", ")}; ${options.quick ? "quick" : "full"} run; ` +
      `load ${loadBefore.join(" ")}\n${renderServer(described)}` +
      (pgPid === undefined
        ? "\n  (postmaster not on this machine or not readable: no Postgres CPU figures)"
        : "")
  )

  // One template database per system, installed by the system itself.
  const templates = new Map<SystemName, string>()
  const descriptions = new Map<string, Description>()
  yield* Effect.addFinalizer(() =>
    Effect.forEach([...templates.values()], (name) => dropDatabase(server.url, name), { discard: true })
  )
  for (const system of options.systems) {
    const name = databaseName(`bench_tpl_${system.replace("-", "")}`)
    const url = yield* createDatabase(server.url, name)
    templates.set(system, name)
    for (const [i, entrant] of entrants.filter((e) => e.system === system).entries())
      yield* Effect.scoped(
        Effect.gen(function* () {
          const child = yield* spawnChild(system, url, { env: childEnv(entrant) })
          if (i === 0) yield* child.call({ op: "install" }, 120_000)
          descriptions.set(entrant.label, yield* child.call<Description>({ op: "describe" }, 10_000))
        })
      )
  }

  if (options.soak !== undefined) {
    // the soak runs each system once, Awa in the first profile listed (tuned by default)
    const first = (s: SystemName) => entrants.find((e) => e.system === s)!
    const soakDescriptions = new Map(
      options.systems.map((s) => [s, descriptions.get(first(s).label)!] as const)
    )
    return yield* runSoak({
      serverUrl: server.url,
      templates,
      descriptions: soakDescriptions,
      systems: options.systems,
      rate: options.soak.rate,
      durationMs: options.soak.durationMs,
      pinnedReader: options.soak.pinnedReader,
      postmasterPid: pgPid,
      resultsDir,
      stamp,
      clone: (name, template) => retryingClone(server.url, name, template),
      env: (s) => childEnv(first(s))
    })
  }

  const results: Array<PhaseResult> = []
  const errors = new Map<string, Array<string>>(entrants.map((e) => [e.label, []]))
  // the scale phase is one run per process count, each like a phase of its own
  const phaseRuns = options.phases.flatMap(
    (phase): Array<{ phase: PhaseName; processes: number }> =>
      phase === "scale"
        ? scaleProcesses.map((processes) => ({ phase, processes }))
        : [{ phase, processes: 1 }]
  )
  // `--rounds`: the whole list again, so a round's figures for every system are minutes apart
  const runs = Array.from({ length: options.rounds }, (_, r) =>
    phaseRuns.map((run) => ({ ...run, round: r + 1 }))
  ).flat()
  for (const [index, { phase, processes, round: roundNo }] of runs.entries()) {
    // rotate the order of entrants from run to run
    const order = entrants.map((_, i) => entrants[(i + index) % entrants.length]!)
    for (const entrant of order) {
      const { system, label } = entrant
      const title =
        (phase === "scale" ? `scale ×${processes}` : phase) + (options.rounds > 1 ? ` r${roundNo}` : "")
      const name = databaseName(`bench_${phase.replaceAll("-", "_")}_${label.replaceAll("-", "")}`)
      const run = Effect.gen(function* () {
        const dbUrl = yield* retryingClone(server.url, name, templates.get(system)!)
        const execArgv = options.cpuProf.includes(system)
          ? [
              "--cpu-prof",
              "--cpu-prof-dir",
              resultsDir,
              "--cpu-prof-name",
              `profile-${stamp}-${label}-${phase}${phase === "scale" ? `-${processes}` : ""}.json`
            ]
          : []
        const env = childEnv(entrant)
        const child: Child = yield* spawnChild(system, dbUrl, { execArgv, env })
        const ctx: PhaseContext = {
          label,
          profile: entrant.profile,
          server: described,
          child,
          spawnMore: spawnChild(system, dbUrl, { env }),
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
        const result: PhaseResult = yield* runPhase(phase, ctx, closeChild, processes)
        return result
      }).pipe(Effect.scoped, Effect.ensuring(Effect.suspend(() => dropDatabase(server.url, name))))
      const began = performance.now()
      const outcome = yield* Effect.result(run)
      if (outcome._tag === "Success") {
        // wall time of the whole phase (clone, child start, warm-up, waits): where a run's time goes
        const r: PhaseResult = {
          ...outcome.success,
          wallSeconds: round((performance.now() - began) / 1000, 1),
          ...(options.rounds > 1 ? { round: roundNo } : {})
        }
        results.push(r)
        const extra =
          r.latency !== undefined
            ? `p50 ${r.latency.pickup.p50} / p95 ${r.latency.pickup.p95} / p99 ${r.latency.pickup.p99} ms`
            : `${r.jobsPerSec.toLocaleString("en-US")} jobs/s`
        yield* Console.log(
          `  ${title.padEnd(14)} ${label.padEnd(15)} ${extra}, ${r.walBytesPerJob} B WAL/job, ` +
            `other cores ${r.quiet.otherCores ?? "n/a"} → ${r.otherCoresDuring ?? "n/a"}, ${r.correctness.detail}`
        )
      } else {
        const message = String(outcome.failure instanceof Error ? outcome.failure.message : outcome.failure)
        errors.get(label)!.push(`${title}: ${message.split("\n")[0]}`)
        yield* Console.error(`  ${title.padEnd(14)} ${label.padEnd(15)} FAILED: ${message}`)
      }
    }
  }

  // the server's raw multi-row insert rate, same sitting (issue 17's alternative batch goal)
  const raw = !(options.pgbench && options.phases.includes("enqueue-batch"))
    ? undefined
    : yield* Effect.result(rawInsert(server.url, pgPid, options.quick ? 5 : 10)).pipe(
        Effect.map((r) => (r._tag === "Success" ? r.success : { error: String(r.failure) }))
      )
  if (raw === undefined && options.pgbench && options.phases.includes("enqueue-batch"))
    yield* Console.error("pgbench: not found (PGBENCH, /usr/lib/postgresql/15/bin/pgbench, PATH); skipped")

  const summaries: Array<SystemSummary> = entrants.map((e) =>
    summarize(e.label, e.profile, descriptions.get(e.label)!, results, errors.get(e.label)!)
  )
  const awaLabels = entrants.filter((e) => e.profile !== undefined).map((e) => e.label)
  // each round's own summaries and ratios: the peers measured in the same minutes
  const byRound = Object.fromEntries(
    awaLabels.map((l) => [
      l,
      ratiosByRound(
        l,
        Array.from({ length: options.rounds }, (_, i) =>
          entrants.map((e) =>
            summarize(
              e.label,
              e.profile,
              descriptions.get(e.label)!,
              results.filter((r) => (r.round ?? 1) === i + 1),
              []
            )
          )
        )
      )
    ])
  )
  const cpus = os.cpus()
  const report = {
    startedAt: startedAt.toISOString(),
    finishedAt: new Date().toISOString(),
    command: `npm run bench --${process.argv.slice(2).length > 0 ? ` ${process.argv.slice(2).join(" ")}` : ""}`,
    mode: options.quick ? "quick" : "full",
    profiles: options.profiles,
    sizes,
    rounds: options.rounds,
    hygiene: options.hygiene,
    git: gitDescription(),
    database: server.started ? "embedded (durable)" : source,
    server: described,
    machine: {
      cpus: cpus.length,
      cpuModel: cpus[0]?.model ?? "unknown",
      memGiB: round(os.totalmem() / 2 ** 30, 1),
      node: process.version,
      loadBefore,
      loadAfter: loadAverage()
    },
    // before issue 17 the only server record; kept for readers of older results
    postgres: described.settings,
    systems: summaries,
    comparison: compare(summaries),
    comparisons: Object.fromEntries(awaLabels.map((l) => [l, compare(summaries, l)])),
    ...(options.rounds > 1 ? { ratiosByRound: byRound } : {}),
    rawInsert: raw ?? null,
    phases: results
  }
  yield* Console.log(
    [
      "",
      renderServer(described),
      "",
      renderSummary(summaries),
      ...(options.rounds > 1 ? ["", renderRounds(byRound)] : []),
      ...(raw === undefined ? [] : ["", renderRawInsert(raw, summaries)]),
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
