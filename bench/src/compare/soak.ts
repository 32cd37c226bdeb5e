/**
 * Soak mode: `npm run bench -- --soak 10m [--pinned-reader] [--rate 200] [--systems awa]`.
 *
 * For each system in turn, in a fresh clone of its template database and its own child process:
 * workers with 50 in flight, a producer offering `rate` jobs/s one insert at a time (open loop)
 * for the duration, and, with `--pinned-reader`, a `REPEATABLE READ` transaction on the same
 * database that took its snapshot before the first job and stays open to the end, so vacuum can
 * remove nothing newer. Every 5 s: throughput, backlog (offered − started), pickup latency of the
 * jobs started in the window, dead tuples and size per table family (and `pg_class`, which
 * TRUNCATE-based reclamation rewrites), the reader's xmin age, and other load on the machine.
 * After the duration: wait for the backlog to drain, then the exactly-once check.
 *
 * Output: a table per system and `bench/results/soak-<timestamp>.json` (+ `soak-latest.json`).
 */
import { writeFileSync } from "node:fs"
import { PgClient } from "@effect/sql-pg"
import { Console, Deferred, Effect, Fiber, Redacted } from "effect"
import { Reactivity } from "effect/reactivity"
import { databaseName, dropDatabase, round, table } from "../lib.ts"
import type { SystemName } from "../systems/types.ts"
import { spawnChild } from "./childProcess.ts"
import { type Residue, residue } from "./observer.ts"
import { cpuDelta, loadAverage, readCpu } from "./proc.ts"
import type { Description, Sample, Timed, Verification } from "./protocol.ts"

export interface SoakOptions {
  readonly serverUrl: string
  readonly templates: ReadonlyMap<SystemName, string>
  readonly descriptions: ReadonlyMap<SystemName, Description>
  readonly systems: ReadonlyArray<SystemName>
  readonly durationMs: number
  readonly rate: number
  readonly pinnedReader: boolean
  readonly postmasterPid: number | undefined
  readonly resultsDir: string
  readonly stamp: string
  readonly clone: (name: string, template: string) => Effect.Effect<string, unknown>
  /** Extra environment of a system's child (Awa's profile: the first of `--profile`). */
  readonly env?: ((system: SystemName) => Readonly<Record<string, string>> | undefined) | undefined
}

const sampleEveryMs = 5_000

interface SoakSample {
  readonly t: number
  readonly offeredPerSec: number
  readonly completedPerSec: number
  readonly backlog: number
  readonly pickup: Sample["pickup"]
  readonly insertErrors: number
  readonly residue: Residue
  readonly postgresCores: number | undefined
  readonly nodeCores: number | undefined
  readonly otherCores: number | undefined
}

/** Opens a REPEATABLE READ transaction on `dbUrl`, takes its snapshot, and holds it until the scope closes. */
const pinReader = (dbUrl: string) =>
  Effect.gen(function* () {
    const sql = yield* PgClient.makeClient({
      url: Redacted.make(dbUrl),
      applicationName: "awa-bench-pinned-reader"
    })
    const taken = yield* Deferred.make<void>()
    yield* sql
      .withTransaction(
        Effect.gen(function* () {
          yield* sql.unsafe("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ").unprepared
          yield* sql`SELECT count(*) FROM pg_class`
          yield* Deferred.succeed(taken, undefined)
          return yield* Effect.never
        })
      )
      .pipe(Effect.forkScoped)
    yield* Deferred.await(taken)
  }).pipe(Effect.provide(Reactivity.layer))

const familyLabel = (family: string) => family.replace(/^(awa|pgboss|graphile_worker|pg_catalog)\./, "")

const soakOne = (o: SoakOptions, system: SystemName) =>
  Effect.gen(function* () {
    const name = databaseName(`bench_soak_${system.replace("-", "")}`)
    yield* Effect.addFinalizer(() => dropDatabase(o.serverUrl, name))
    const dbUrl = yield* o.clone(name, o.templates.get(system)!)
    const child = yield* spawnChild(system, dbUrl, { env: o.env?.(system) })
    yield* child.call({ op: "startWorkers" }, 60_000)
    if (o.pinnedReader) yield* pinReader(dbUrl)
    const seconds = o.durationMs / 1000
    const n = Math.round(o.rate * seconds)
    yield* Console.log(
      `soak ${system}: ${o.rate} jobs/s for ${seconds} s${o.pinnedReader ? " with a pinned REPEATABLE READ reader" : ""}`
    )
    const producer = yield* Effect.forkScoped(
      child.call<Timed>({ op: "produce", from: 0, rate: o.rate, seconds }, o.durationMs + 10 * 60_000)
    )
    const samples: Array<SoakSample> = []
    const start = performance.now()
    let last = { at: start, offered: 0, executed: 0, cpu: readCpu(o.postmasterPid, child.pid) }
    const takeSample = Effect.gen(function* () {
      const s = yield* child.call<Sample>({ op: "sample" }, 60_000)
      const r = yield* residue(dbUrl)
      const at = performance.now()
      const cpu = readCpu(o.postmasterPid, child.pid)
      const d = cpuDelta(last.cpu, cpu)
      const dt = (at - last.at) / 1000
      const sample: SoakSample = {
        t: round((at - start) / 1000, 1),
        offeredPerSec: Math.round((s.offered - last.offered) / dt),
        completedPerSec: Math.round((s.executed - last.executed) / dt),
        backlog: s.offered - s.executed,
        pickup: s.pickup,
        insertErrors: s.insertErrors,
        residue: r,
        postgresCores: d.postgres === undefined ? undefined : round(d.postgres / dt),
        nodeCores: d.child === undefined ? undefined : round(d.child / dt),
        otherCores: d.otherCores === undefined ? undefined : round(d.otherCores)
      }
      last = { at, offered: s.offered, executed: s.executed, cpu }
      samples.push(sample)
      const dead = Object.entries(r.dead)
        .filter(([, v]) => v > 0)
        .map(([k, v]) => `${familyLabel(k)} ${v}`)
        .join(", ")
      yield* Console.log(
        `  t=${String(sample.t).padStart(6)} s  ${sample.completedPerSec}/s  backlog ${sample.backlog}  ` +
          `p50 ${s.pickup.p50} p99 ${s.pickup.p99} ms  dead: ${dead || "none"}  xmin age ${r.xminAge ?? "-"}  ` +
          `other ${sample.otherCores ?? "n/a"} cores`
      )
    })
    while (producer.pollUnsafe() === undefined) {
      yield* Effect.sleep(sampleEveryMs)
      yield* takeSample
    }
    yield* Fiber.join(producer)
    const settle = yield* child.call<Timed>({ op: "settle", total: n, timeoutMs: 5 * 60_000 }, 6 * 60_000)
    yield* takeSample
    yield* child.call({ op: "stopWorkers" }, 120_000)
    const v = yield* child.call<Verification>({ op: "verify", ranges: [{ from: 0, count: n }] }, 60_000)
    const ok = v.executedOnce === n && v.duplicates === 0 && v.outside === 0
    yield* Console.log(
      `  ${system}: ${ok ? `all ${n} jobs ran exactly once` : `FAILED: ${JSON.stringify(v)}`}; backlog drained ${round(settle.ms / 1000, 1)} s after the producer stopped`
    )
    return {
      system,
      version: o.descriptions.get(system)?.version,
      settings: o.descriptions.get(system)?.settings,
      jobs: n,
      correct: ok,
      verification: v,
      drainAfterMs: Math.round(settle.ms),
      samples
    }
  }).pipe(Effect.scoped)

const summaryRows = (r: Effect.Success<ReturnType<typeof soakOne>>) => {
  const s = r.samples
  const during = s.slice(0, -1)
  const max = (f: (x: SoakSample) => number) => Math.max(0, ...s.map(f))
  const families = [...new Set(s.flatMap((x) => Object.keys(x.residue.dead)))]
  const deadRows = families
    .map((f) => [familyLabel(f), max((x) => x.residue.dead[f] ?? 0), s.at(-1)?.residue.dead[f] ?? 0])
    .filter(([, m]) => (m as number) > 0)
  const mean = (f: (x: SoakSample) => number) =>
    round(during.reduce((a, x) => a + f(x), 0) / Math.max(1, during.length), 1)
  return {
    text: [
      `${r.system}: ${r.jobs} jobs, ${r.correct ? "exactly once" : "FAILED"}; completed/s mean ${mean((x) => x.completedPerSec)}, ` +
        `backlog max ${max((x) => x.backlog)}, pickup p99 max ${max((x) => x.pickup.p99)} ms, ` +
        `Postgres ${mean((x) => x.postgresCores ?? 0)} cores, Node ${mean((x) => x.nodeCores ?? 0)} cores, ` +
        `other ${mean((x) => x.otherCores ?? 0)} cores`,
      deadRows.length === 0
        ? "  no dead tuples on any table"
        : table(["dead tuples", "max", "at end"], deadRows as Array<Array<string | number>>)
    ].join("\n")
  }
}

export const runSoak = (o: SoakOptions) =>
  Effect.gen(function* () {
    const loadBefore = loadAverage()
    const results: Array<Effect.Success<ReturnType<typeof soakOne>>> = []
    for (const system of o.systems) results.push(yield* soakOne(o, system))
    yield* Console.log(`\n${results.map((r) => summaryRows(r).text).join("\n\n")}`)
    const report = {
      mode: "soak",
      command: `npm run bench -- ${process.argv.slice(2).join(" ")}`,
      durationMs: o.durationMs,
      rate: o.rate,
      pinnedReader: o.pinnedReader,
      sampleEveryMs,
      loadBefore,
      loadAfter: loadAverage(),
      systems: results
    }
    const json = `${JSON.stringify(report, null, 2)}\n`
    const file = `${o.resultsDir}soak-${o.stamp}.json`
    writeFileSync(file, json)
    writeFileSync(`${o.resultsDir}soak-latest.json`, json)
    yield* Console.log(`\nwritten ${file} and ${o.resultsDir}soak-latest.json`)
  })
