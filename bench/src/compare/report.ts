/**
 * The comparison's summary per system, the ratio of each metric to the best peer, the goals of
 * issue 5, and the plain-text tables printed at the end of a run.
 */
import { round, table } from "../lib.ts"
import type { Profile } from "../systems/types.ts"
import { type PhaseName, type PhaseResult, scaleProcesses, type TableDelta } from "./phases.ts"

export interface SystemSummary {
  /** The entrant: the system's name, or `awa-defaults` for Awa's defaults profile. */
  readonly system: string
  /** Awa's profile; absent for the peers. */
  readonly profile?: Profile | undefined
  readonly version: string
  readonly settings: Readonly<Record<string, unknown>>
  readonly enqueueOnePerSec: number | null
  /** 8 concurrent producers, one job per transaction: on one queue, and over 8 queues. */
  readonly enqueueOne8PerSec: number | null
  readonly enqueueOne8QueuesPerSec: number | null
  readonly enqueueBatchPerSec: number | null
  /** One call with the whole bulk batch (Awa's bulk path; the peers' batch call with the same size). */
  readonly enqueueBulkPerSec: number | null
  readonly drainPerSec: number | null
  /** The scale phase: drain jobs/s by number of worker processes ("1", "2", "4"). */
  readonly scalePerSec: Readonly<Record<string, number>> | null
  readonly latencyMs: { readonly p50: number; readonly p95: number; readonly p99: number } | null
  /** During the drain. */
  readonly walBytesPerJob: number | null
  /** During the drain: change of `n_dead_tup` summed over the system's tables, per job. */
  readonly deadTuplesPerJob: number | null
  readonly deadTuplesPerJobByTable: Record<string, TableDelta> | null
  /** During the drain, CPU ms per 1,000 jobs. */
  readonly cpuMsPer1000Jobs: { readonly node: number | null; readonly postgres: number | null } | null
  /** Every phase passed its exactly-once / stored-count check. */
  readonly correct: boolean
  readonly errors: ReadonlyArray<string>
}

export type Direction = "higher" | "lower"

export interface Metric {
  readonly key: string
  readonly label: string
  readonly direction: Direction
  readonly value: (s: SystemSummary) => number | null | undefined
  /** Goal for Awa ÷ best peer (or an absolute goal, when `absolute`). */
  readonly goal?: { readonly ratio?: number; readonly absolute?: number; readonly text: string } | undefined
}

export const metrics: ReadonlyArray<Metric> = [
  {
    key: "enqueueOnePerSec",
    label: "enqueue one at a time (jobs/s)",
    direction: "higher",
    value: (s) => s.enqueueOnePerSec,
    goal: { ratio: 3, text: "≥ 3× best peer" }
  },
  {
    key: "enqueueOne8PerSec",
    label: "enqueue one, 8 producers, 1 queue (jobs/s)",
    direction: "higher",
    value: (s) => s.enqueueOne8PerSec
  },
  {
    key: "enqueueOne8QueuesPerSec",
    label: "enqueue one, 8 producers, 8 queues (jobs/s)",
    direction: "higher",
    value: (s) => s.enqueueOne8QueuesPerSec
  },
  {
    key: "enqueueBatchPerSec",
    label: "enqueue in chunks of 1,000 (jobs/s)",
    direction: "higher",
    value: (s) => s.enqueueBatchPerSec,
    goal: { ratio: 4, text: "≥ 4× best peer" }
  },
  {
    key: "enqueueBulkPerSec",
    label: "enqueue in one call (jobs/s)",
    direction: "higher",
    value: (s) => s.enqueueBulkPerSec,
    goal: { absolute: 100_000, text: "Awa ≥ 100,000 jobs/s" }
  },
  {
    key: "drainPerSec",
    label: "drain (jobs/s)",
    direction: "higher",
    value: (s) => s.drainPerSec,
    goal: { ratio: 1.25, text: "≥ 1.25× best peer" }
  },
  ...scaleProcesses.map(
    (p): Metric => ({
      key: `scale${p}PerSec`,
      label: `drain, ${p} worker process${p === 1 ? "" : "es"} (jobs/s)`,
      direction: "higher",
      value: (s) => s.scalePerSec?.[String(p)]
    })
  ),
  { key: "latencyP50", label: "pickup p50 (ms)", direction: "lower", value: (s) => s.latencyMs?.p50 },
  { key: "latencyP95", label: "pickup p95 (ms)", direction: "lower", value: (s) => s.latencyMs?.p95 },
  {
    key: "latencyP99",
    label: "pickup p99 (ms)",
    direction: "lower",
    value: (s) => s.latencyMs?.p99,
    goal: { absolute: 10, text: "Awa ≤ 10 ms" }
  },
  {
    key: "walBytesPerJob",
    label: "WAL per job, drain (bytes)",
    direction: "lower",
    value: (s) => s.walBytesPerJob,
    goal: { absolute: 1024, text: "Awa ≤ 1 KiB" }
  },
  {
    key: "deadTuplesPerJob",
    label: "dead tuples per job, drain",
    direction: "lower",
    value: (s) => s.deadTuplesPerJob,
    goal: { absolute: 0, text: "Awa 0 on ring tables" }
  },
  {
    key: "nodeCpu",
    label: "Node CPU, drain (ms / 1,000 jobs)",
    direction: "lower",
    value: (s) => s.cpuMsPer1000Jobs?.node
  },
  {
    key: "postgresCpu",
    label: "Postgres CPU, drain (ms / 1,000 jobs)",
    direction: "lower",
    value: (s) => s.cpuMsPer1000Jobs?.postgres
  }
]

export interface Comparison {
  readonly metric: string
  readonly direction: Direction
  readonly awa: number | null
  readonly bestPeer: { readonly system: string; readonly value: number } | null
  /** Awa ÷ best peer. */
  readonly ratio: number | null
  readonly goal: string | null
  readonly met: boolean | null
}

const isNumber = (v: number | null | undefined): v is number => typeof v === "number" && Number.isFinite(v)

const isAwa = (s: SystemSummary) => s.profile !== undefined

/** Ratios of the Awa entrant `awaLabel` (default: the first Awa entrant) to the best peer. */
export const compare = (
  summaries: ReadonlyArray<SystemSummary>,
  awaLabel?: string
): ReadonlyArray<Comparison> =>
  metrics.map((m) => {
    const awa = summaries.find((s) => (awaLabel === undefined ? isAwa(s) : s.system === awaLabel))
    const awaValue = awa === undefined ? undefined : m.value(awa)
    const peers = summaries
      .filter((s) => !isAwa(s))
      .flatMap((s) => {
        const v = m.value(s)
        return isNumber(v) ? [{ system: s.system, value: v }] : []
      })
    const bestPeer =
      peers.length === 0
        ? null
        : peers.reduce((a, b) => ((m.direction === "higher" ? b.value > a.value : b.value < a.value) ? b : a))
    const ratio =
      isNumber(awaValue) && bestPeer !== null && bestPeer.value !== 0
        ? round(awaValue / bestPeer.value, 3)
        : null
    let met: boolean | null = null
    if (m.goal?.ratio !== undefined && ratio !== null) met = ratio >= m.goal.ratio
    if (m.goal?.absolute !== undefined && isNumber(awaValue))
      met = m.direction === "higher" ? awaValue >= m.goal.absolute : awaValue <= m.goal.absolute
    return {
      metric: m.key,
      direction: m.direction,
      awa: isNumber(awaValue) ? awaValue : null,
      bestPeer,
      ratio,
      goal: m.goal?.text ?? null,
      met
    }
  })

const fmt = (v: number | null | undefined): string => {
  if (!isNumber(v)) return "n/a"
  if (Math.abs(v) >= 1000) return Math.round(v).toLocaleString("en-US")
  if (Math.abs(v) >= 100) return String(Math.round(v))
  if (Math.abs(v) >= 10) return v.toFixed(1)
  return v.toFixed(2)
}

export const renderSummary = (summaries: ReadonlyArray<SystemSummary>): string => {
  const awas = summaries.filter(isAwa)
  const comparisons = awas.map((a) => compare(summaries, a.system))
  const header = [
    "metric",
    ...summaries.map((s) => s.system),
    ...awas.map((a) => `${a.system} ÷ best peer`),
    "goal",
    ...awas.map((a) => (awas.length === 1 ? "met" : `met (${a.system})`))
  ]
  const rows = metrics.map((m, i) => [
    `${m.label} ${m.direction === "higher" ? "↑" : "↓"}`,
    ...summaries.map((s) => fmt(m.value(s))),
    ...comparisons.map((cs) => {
      const c = cs[i]!
      return c.ratio === null ? "n/a" : `${c.ratio.toFixed(2)}×${c.bestPeer ? ` (${c.bestPeer.system})` : ""}`
    }),
    m.goal?.text ?? "",
    ...comparisons.map((cs) => {
      const c = cs[i]!
      return c.met === null ? "" : c.met ? "yes" : "NO"
    })
  ])
  const correctness = summaries.map(
    (s) => `${s.system}: ${s.correct ? "every phase exactly once" : `FAILED ${s.errors.join("; ")}`}`
  )
  return [table(header, rows), "", `Correctness: ${correctness.join(" · ")}`].join("\n")
}

/** ` r2` for a result of round 2 of `--rounds`, else nothing. */
const roundOf = (r: PhaseResult) => (r.round === undefined ? "" : ` r${r.round}`)

export const renderPhases = (results: ReadonlyArray<PhaseResult>): string =>
  table(
    [
      "phase",
      "system",
      "jobs",
      "s",
      "jobs/s",
      "WAL B/job",
      "node ms/1k",
      "pg ms/1k",
      "waited s",
      "other cores before",
      "other cores during",
      "load1",
      "check"
    ],
    results.map((r) => [
      (r.processes !== undefined ? `${r.phase} ×${r.processes}` : r.phase) + roundOf(r),
      r.system,
      r.jobs,
      r.seconds,
      r.jobsPerSec,
      r.walBytesPerJob,
      fmt(r.cpuMsPer1000Jobs.node),
      fmt(r.cpuMsPer1000Jobs.postgres),
      round(r.quiet.waitedMs / 1000, 1),
      fmt(r.quiet.otherCores),
      fmt(r.otherCoresDuring),
      r.load1After,
      r.correctness.ok ? "ok" : "FAIL"
    ])
  )

export const renderDrainTables = (results: ReadonlyArray<PhaseResult>): string =>
  results
    .filter((r) => r.phase === "drain" && r.tables !== undefined)
    .map((r) => {
      const rows = Object.entries(r.tables!).map(([t, d]) => [
        t,
        d.insPerJob,
        d.updPerJob,
        d.delPerJob,
        d.deadPerJob,
        d.deadAfter,
        d.vacuumed ? "yes" : ""
      ])
      return `${r.system} drain${roundOf(r)}, per job (dead = change of n_dead_tup):\n${table(
        ["table", "ins", "upd", "del", "dead", "dead after", "vacuumed"],
        rows
      )}`
    })
    .join("\n\n")

export const renderLatency = (results: ReadonlyArray<PhaseResult>): string =>
  table(
    [
      "system",
      "offered",
      "p50",
      "p95",
      "p99",
      "max",
      "min",
      "send→start p99",
      "insert p50",
      "schedule lag max"
    ],
    results
      .filter((r) => r.latency !== undefined)
      .map((r) => {
        const l = r.latency!
        return [
          r.system + roundOf(r),
          l.offered,
          l.pickup.p50,
          l.pickup.p95,
          l.pickup.p99,
          l.pickup.max,
          l.pickup.min,
          l.sendToStart.p99,
          l.insert.p50Ms,
          l.maxScheduleLagMs
        ]
      })
  )

/**
 * With `--rounds`, a phase has one result per round: the summary takes the median one (by the
 * pickup p99 for the latency phase, else by jobs/s; of an even count, the lower middle), so its
 * other figures (CPU, WAL) come from the same run.
 */
const medianResult = (runs: ReadonlyArray<PhaseResult>): PhaseResult | undefined => {
  if (runs.length <= 1) return runs[0]
  const key = (r: PhaseResult) => r.latency?.pickup.p99 ?? r.jobsPerSec
  const sorted = [...runs].sort((a, b) => key(a) - key(b))
  return sorted[Math.floor((sorted.length - 1) / 2)]
}

/** Per metric, the Awa entrant's ratio to the best peer in each round (null where one is missing). */
export const ratiosByRound = (
  awaLabel: string,
  rounds: ReadonlyArray<ReadonlyArray<SystemSummary>>
): Record<string, ReadonlyArray<number | null>> => {
  const perRound = rounds.map((summaries) => compare(summaries, awaLabel))
  return Object.fromEntries(
    metrics.map((m, i) => [m.key, perRound.map((comparisons) => comparisons[i]!.ratio)] as const)
  )
}

const median = (values: ReadonlyArray<number>): number => {
  const sorted = [...values].sort((a, b) => a - b)
  const mid = Math.floor(sorted.length / 2)
  return sorted.length % 2 === 1 ? sorted[mid]! : (sorted[mid - 1]! + sorted[mid]!) / 2
}

/** Awa's ratio to the best peer round by round, with the median of the rounds, per metric measured. */
export const renderRounds = (
  byRound: Readonly<Record<string, Record<string, ReadonlyArray<number | null>>>>
): string =>
  Object.entries(byRound)
    .map(([label, ratios]) => {
      const rows = metrics.flatMap((m) => {
        const values = ratios[m.key] ?? []
        const known = values.filter(isNumber)
        return known.length === 0
          ? []
          : [
              [
                m.label,
                values.map((v) => (isNumber(v) ? v.toFixed(2) : "n/a")).join(" / "),
                median(known).toFixed(2)
              ]
            ]
      })
      return `${label} ÷ best peer, round by round (the peers of the same round):\n${table(
        ["metric", "rounds", "median"],
        rows
      )}`
    })
    .join("\n\n")

/** Per entrant, the figures of its phases (null where a phase failed or was not run). */
export const summarize = (
  system: string,
  profile: Profile | undefined,
  description: { version: string; settings: Readonly<Record<string, unknown>> },
  results: ReadonlyArray<PhaseResult>,
  errors: ReadonlyArray<string>
): SystemSummary => {
  const of = (phase: PhaseName, processes?: number) =>
    medianResult(
      results.filter(
        (r) =>
          r.system === system && r.phase === phase && (processes === undefined || r.processes === processes)
      )
    )
  const drain = of("drain")
  const latency = of("latency")
  const mine = results.filter((r) => r.system === system)
  const failed = mine.filter((r) => !r.correctness.ok).map((r) => `${r.phase}: ${r.correctness.detail}`)
  const scaled = scaleProcesses.flatMap((p) => {
    const r = of("scale", p)
    return r === undefined ? [] : [r]
  })
  return {
    system,
    ...(profile === undefined ? {} : { profile }),
    version: description.version,
    settings: description.settings,
    enqueueOnePerSec: of("enqueue-one")?.jobsPerSec ?? null,
    enqueueOne8PerSec: of("enqueue-one-8")?.jobsPerSec ?? null,
    enqueueOne8QueuesPerSec: of("enqueue-one-8q")?.jobsPerSec ?? null,
    enqueueBatchPerSec: of("enqueue-batch")?.jobsPerSec ?? null,
    enqueueBulkPerSec: of("enqueue-bulk")?.jobsPerSec ?? null,
    drainPerSec: drain?.jobsPerSec ?? null,
    scalePerSec:
      scaled.length === 0 ? null : Object.fromEntries(scaled.map((r) => [String(r.processes), r.jobsPerSec])),
    latencyMs:
      latency?.latency === undefined
        ? null
        : {
            p50: latency.latency.pickup.p50,
            p95: latency.latency.pickup.p95,
            p99: latency.latency.pickup.p99
          },
    walBytesPerJob: drain?.walBytesPerJob ?? null,
    deadTuplesPerJob: drain?.deadTuplesPerJob ?? null,
    deadTuplesPerJobByTable: drain?.tables ?? null,
    cpuMsPer1000Jobs:
      drain === undefined
        ? null
        : { node: drain.cpuMsPer1000Jobs.node ?? null, postgres: drain.cpuMsPer1000Jobs.postgres ?? null },
    correct: failed.length === 0 && errors.length === 0,
    errors: [...failed, ...errors]
  }
}

export const renderStatements = (results: ReadonlyArray<PhaseResult>): string =>
  results
    .filter((r) => r.statements !== undefined && (r.phase === "drain" || r.phase === "latency"))
    .map(
      (r) =>
        `${r.system} ${r.phase}: top statements by server time (pg_stat_statements)\n${table(
          ["ms/1k jobs", "calls", "exec ms", "plan ms", "rows", "query"],
          r.statements!.map((st) => [
            st.msPer1000Jobs,
            st.calls,
            st.execMs,
            st.planMs,
            st.rows,
            st.query.slice(0, 100)
          ])
        )}`
    )
    .join("\n\n")
