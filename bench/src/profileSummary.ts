/**
 * Sums a V8 `.cpuprofile` (as `profileDrain.ts` writes) by self time: the top functions and the
 * top files or packages, in % of the profile and in ms. For reading where Node's time goes
 * (docs/benchmarks.md, ADR 0031). The first table groups the samples by owner (idle, the Effect
 * runtime, Awa's code, the SQL driver, …), for two systems' profiles side by side.
 *
 *   node bench/src/profileSummary.ts bench/results/drain-awa-….cpuprofile [--top 30]
 */
import { readFileSync } from "node:fs"

interface Node {
  readonly id: number
  readonly callFrame: { functionName: string; url: string; lineNumber: number }
  readonly children?: ReadonlyArray<number>
}
interface Profile {
  readonly nodes: ReadonlyArray<Node>
  readonly samples: ReadonlyArray<number>
  readonly timeDeltas: ReadonlyArray<number>
  readonly startTime: number
  readonly endTime: number
}

const file = process.argv[2]
if (file === undefined) throw new Error("usage: profileSummary.ts <file.cpuprofile> [--top N]")
const topIndex = process.argv.indexOf("--top")
const top = topIndex >= 0 ? Number(process.argv[topIndex + 1]) : 30
const profile = JSON.parse(readFileSync(file, "utf8")) as Profile

const byId = new Map(profile.nodes.map((n) => [n.id, n]))
const selfUs = new Map<number, number>()
profile.samples.forEach((id, i) => {
  selfUs.set(id, (selfUs.get(id) ?? 0) + (profile.timeDeltas[i] ?? 0))
})
const totalUs = profile.endTime - profile.startTime

/** node_modules/<pkg> or the repository path, without the file:// prefix. */
const where = (url: string): string => {
  if (url === "") return "(native)"
  const nm = url.lastIndexOf("node_modules/")
  if (nm >= 0) {
    const rest = url.slice(nm + "node_modules/".length).split("/")
    const pkg = rest[0]!.startsWith("@") ? `${rest[0]}/${rest[1]}` : rest[0]!
    return `${pkg}/${rest.at(-1)}`
  }
  const packages = url.indexOf("/packages/")
  if (packages >= 0) return url.slice(packages + 1)
  return url.replace(/^file:\/\//, "").replace(/^.*\/bench\//, "bench/")
}

/**
 * A coarse owner for a sample, to set two systems' profiles side by side: time the thread waited
 * (idle), the profiler's own, V8's collector, socket writes (on a busy two-core machine mostly the
 * thread descheduled while the write wakes a backend), Awa's code, the Effect runtime, a SQL
 * driver (Effect's or node-postgres), a peer's own package, Node's internals, anything else.
 */
const groupOf = (functionName: string, url: string): string => {
  if (functionName === "(idle)") return "idle"
  if (functionName === "(garbage collector)") return "garbage collector"
  if (url.startsWith("node:inspector")) return "profiler"
  if (url === "")
    return functionName === "writeBuffer" || functionName === "writev" ? "socket writes" : "other native"
  if (url.includes("/packages/")) return "awa"
  // before the driver: `pg-boss` would match its `pg-…` packages
  if (url.includes("node_modules/graphile-worker/") || url.includes("node_modules/pg-boss/")) return "peer"
  if (
    url.includes("node_modules/@effect/sql-pg/") ||
    /node_modules\/(pg|pg-[a-z]+|postgres-[a-z]+)\//.test(url)
  )
    return "sql driver"
  if (url.includes("node_modules/effect/")) return "effect runtime"
  if (url.startsWith("node:")) return "node internals"
  return "other"
}

const functions = new Map<string, number>()
const files = new Map<string, number>()
const groups = new Map<string, number>()
for (const [id, us] of selfUs) {
  const { functionName, url, lineNumber } = byId.get(id)!.callFrame
  const place = where(url)
  const fn = `${functionName || "(anonymous)"} ${place}${url === "" ? "" : `:${lineNumber + 1}`}`
  functions.set(fn, (functions.get(fn) ?? 0) + us)
  files.set(place, (files.get(place) ?? 0) + us)
  const group = groupOf(functionName, url)
  groups.set(group, (groups.get(group) ?? 0) + us)
}

const print = (title: string, entries: Map<string, number>) => {
  console.log(`\n${title}`)
  for (const [name, us] of [...entries].sort((a, b) => b[1] - a[1]).slice(0, top))
    console.log(
      `${((us / totalUs) * 100).toFixed(1).padStart(5)} %  ${(us / 1000).toFixed(0).padStart(6)} ms  ${name}`
    )
}
console.log(`${file}: ${(totalUs / 1000).toFixed(0)} ms profiled`)
print("self time by group", groups)
print("self time by file", files)
print("self time by function", functions)
