/**
 * Issue 20's cost proof in one command: the claim call's p99 with grants against without, as
 * pairs of `pickupTrace.ts` runs (a keyed queue under a key policy, then the same workload with
 * no key, or the other way round: the order alternates by pair so a drifting machine favours
 * neither), each in a process and a database of its own. Prints one row per pair and the
 * summaries the docs report: the per-pair p99 ratio's median (how often keyed wins), the ratio
 * of the runs' median p99s, and the p50 ratio.
 *
 *   DATABASE_URL=postgres://… node --conditions=@awa/source bench/src/keyedClaimPairs.ts
 *     [--pairs 8] [--seconds 45] [--keys 50] [--limit 2] [--rate 200]
 *
 * `--aa`: the control (an A/A run): both runs of every pair are plain, so the ratios show the
 * measure's own spread between two identical workloads a minute apart.
 *
 * A pair's two runs share the machine's state of that minute and nothing else; the calls that
 * overlap a completion carry the tail (docs/benchmarks.md, "The claim call's own p99"), so the
 * table shows how many did, and the p99 of those that ran alone.
 */
import { execFileSync } from "node:child_process"
import { join } from "node:path"
import { intArg, round } from "./lib.ts"

const pairs = intArg("--pairs", 8)
const seconds = intArg("--seconds", 45)
const keys = intArg("--keys", 50)
const limit = intArg("--limit", 2)
const rate = intArg("--rate", 200)
/** `--aa`: both runs of a pair without keys (the measure's control). */
const control = process.argv.includes("--aa")
if (process.env.DATABASE_URL === undefined) throw new Error("DATABASE_URL is required")

interface Run {
  readonly p50: number
  readonly p99: number
  readonly overlapping: number
  readonly aloneP99: number
}

const quantiles = /claim calls, ms p50 \/ p90 \/ p99 \/ max: all \d+ ([\d.]+) \/ [\d.]+ \/ ([\d.]+) \//
const split =
  /claim calls overlapping a finalize call: (\d+) [\d.]+ \/ [\d.]+ \/ [\d.]+ \/ [\d.]+; alone: \d+ [\d.]+ \/ [\d.]+ \/ ([\d.]+) \//

/** One `pickupTrace.ts` run in a child process (this process's Node and flags); its claim calls. */
const run = (withKeys: boolean): Run => {
  const keysOfRun = withKeys && !control ? keys : 0
  const out = execFileSync(
    process.execPath,
    [
      ...process.execArgv,
      join(import.meta.dirname, "pickupTrace.ts"),
      ...["--keys", String(keysOfRun), "--limit", String(limit), "--rate", String(rate)],
      ...["--seconds", String(seconds), "--slowest", "0"]
    ],
    { encoding: "utf8", env: process.env, maxBuffer: 64 * 1024 * 1024 }
  )
  const q = quantiles.exec(out)
  const s = split.exec(out)
  if (q === null || s === null) throw new Error(`pickupTrace printed no claim calls:\n${out}`)
  return { p50: Number(q[1]), p99: Number(q[2]), overlapping: Number(s[1]), aloneP99: Number(s[2]) }
}

const median = (xs: ReadonlyArray<number>) => {
  const sorted = [...xs].sort((a, b) => a - b)
  const mid = Math.floor(sorted.length / 2)
  return sorted.length % 2 === 1 ? sorted[mid]! : (sorted[mid - 1]! + sorted[mid]!) / 2
}

const results: Array<{ readonly keyed: Run; readonly plain: Run }> = []
console.log(
  `${pairs} pairs of ${seconds} s at ${rate} jobs/s, ` +
    (control
      ? "control: no key in either run"
      : `${keys} keys at most ${limit} in flight each against no key`)
)
console.log(
  "| pair | claim p50 keyed / plain ms | claim p99 keyed / plain ms | keyed ÷ plain p99 | calls overlapping a finalize, keyed / plain | p99 of the calls alone, keyed / plain |"
)
console.log("| ---: | --- | --- | ---: | --- | --- |")
for (let pair = 1; pair <= pairs; pair++) {
  const keyedFirst = pair % 2 === 1
  const first = run(keyedFirst)
  const second = run(!keyedFirst)
  const r = keyedFirst ? { keyed: first, plain: second } : { keyed: second, plain: first }
  results.push(r)
  console.log(
    `| ${pair} | ${r.keyed.p50} / ${r.plain.p50} | ${r.keyed.p99} / ${r.plain.p99} | ` +
      `${round(r.keyed.p99 / r.plain.p99)} | ${r.keyed.overlapping} / ${r.plain.overlapping} | ` +
      `${r.keyed.aloneP99} / ${r.plain.aloneP99} |`
  )
}
const keyedP99 = median(results.map((r) => r.keyed.p99))
const plainP99 = median(results.map((r) => r.plain.p99))
console.log(
  `per-pair p99 ratio: median ${round(median(results.map((r) => r.keyed.p99 / r.plain.p99)), 3)}×, ` +
    `keyed lower in ${results.filter((r) => r.keyed.p99 < r.plain.p99).length} of ${results.length}; ` +
    `the runs' median p99s ${keyedP99} / ${plainP99} ms (${round(keyedP99 / plainP99, 3)}×); ` +
    `p50 ratio median ${round(median(results.map((r) => r.keyed.p50 / r.plain.p50)), 3)}×`
)
