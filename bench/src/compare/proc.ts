/**
 * CPU accounting from Linux `/proc`: per process (a Node child, the Postgres server with all its
 * backends) and machine-wide, so a phase can report its own CPU and what everything else on the
 * machine used meanwhile. Everything returns `undefined` where `/proc` is not readable.
 */
import { execFileSync } from "node:child_process"
import { readdirSync, readFileSync } from "node:fs"
import os from "node:os"

const clockTicks = (() => {
  try {
    const n = Number(execFileSync("getconf", ["CLK_TCK"], { encoding: "utf8" }).trim())
    return Number.isFinite(n) && n > 0 ? n : 100
  } catch {
    return 100
  }
})()

interface ProcStat {
  readonly ppid: number
  /** utime + stime, seconds. */
  readonly self: number
  /** cutime + cstime (children waited for), seconds. */
  readonly children: number
}

/** Fields of `/proc/<pid>/stat` after the `comm` field (which may hold spaces). */
const readStat = (pid: number): ProcStat | undefined => {
  try {
    const text = readFileSync(`/proc/${pid}/stat`, "utf8")
    const f = text.slice(text.lastIndexOf(")") + 2).split(" ")
    // f[0] is field 3 (state): field k is f[k - 3]
    return {
      ppid: Number(f[1]),
      self: (Number(f[11]) + Number(f[12])) / clockTicks,
      children: (Number(f[13]) + Number(f[14])) / clockTicks
    }
  } catch {
    return undefined
  }
}

/** CPU seconds of one process (and its reaped children). */
export const processCpu = (pid: number): number | undefined => {
  const s = readStat(pid)
  return s === undefined ? undefined : s.self + s.children
}

/**
 * CPU seconds of a process tree one level deep: the root's own and reaped children's time plus
 * every live child's. The difference of two readings is exact for a Postgres postmaster: a
 * backend that exits in between moves its whole time into the postmaster's reaped-children sum.
 */
export const treeCpu = (rootPid: number): number | undefined => {
  const root = readStat(rootPid)
  if (root === undefined) return undefined
  let total = root.self + root.children
  for (const entry of readdirSync("/proc")) {
    if (!/^\d+$/.test(entry)) continue
    const s = readStat(Number(entry))
    if (s !== undefined && s.ppid === rootPid) total += s.self
  }
  return total
}

/** Machine-wide busy and total CPU seconds since boot (all cores), from `/proc/stat`. */
export const machineCpu = (): { busy: number; total: number } | undefined => {
  try {
    const line = readFileSync("/proc/stat", "utf8").split("\n")[0]!
    const [user, nice, system, idle, iowait, irq, softirq, steal] = line
      .trim()
      .split(/\s+/)
      .slice(1)
      .map(Number)
    const busy = user! + nice! + system! + irq! + softirq! + steal!
    return { busy: busy / clockTicks, total: (busy + idle! + iowait!) / clockTicks }
  } catch {
    return undefined
  }
}

/** A reading of everything a phase accounts for. */
export interface CpuReading {
  readonly at: number
  readonly machine: { busy: number; total: number } | undefined
  readonly postgres: number | undefined
  readonly child: number | undefined
  readonly self: number
}

/** The child processes a phase runs in: one, or several (the scale phase), summed. */
export type ChildPids = number | ReadonlyArray<number> | undefined

const childrenCpu = (pids: ChildPids): number | undefined => {
  if (pids === undefined) return undefined
  let total = 0
  for (const pid of typeof pids === "number" ? [pids] : pids) {
    const cpu = processCpu(pid)
    if (cpu === undefined) return undefined
    total += cpu
  }
  return total
}

export const readCpu = (postmasterPid: number | undefined, childPids: ChildPids): CpuReading => {
  const usage = process.cpuUsage()
  return {
    at: performance.now(),
    machine: machineCpu(),
    postgres: postmasterPid === undefined ? undefined : treeCpu(postmasterPid),
    child: childrenCpu(childPids),
    self: (usage.user + usage.system) / 1e6
  }
}

/** CPU used between two readings, in seconds; `other` is the rest of the machine, in cores. */
export interface CpuDelta {
  readonly seconds: number
  readonly postgres: number | undefined
  readonly child: number | undefined
  readonly orchestrator: number
  /** Average cores used by everything else on the machine over the interval. */
  readonly otherCores: number | undefined
}

const diff = (a: number | undefined, b: number | undefined) =>
  a === undefined || b === undefined ? undefined : b - a

export const cpuDelta = (from: CpuReading, to: CpuReading): CpuDelta => {
  const seconds = (to.at - from.at) / 1000
  const postgres = diff(from.postgres, to.postgres)
  const child = diff(from.child, to.child)
  const orchestrator = to.self - from.self
  const busy = diff(from.machine?.busy, to.machine?.busy)
  const otherCores =
    busy === undefined || seconds <= 0
      ? undefined
      : Math.max(0, busy - (postgres ?? 0) - (child ?? 0) - orchestrator) / seconds
  return { seconds, postgres, child, orchestrator, otherCores }
}

export const loadAverage = () => os.loadavg().map((l) => Number(l.toFixed(2)))

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))

export interface QuietWait {
  readonly waitedMs: number
  /** Cores used by other processes over the last 1 s sample before the phase. */
  readonly otherCores: number | undefined
  readonly quiet: boolean
  readonly load1: number
}

/**
 * Waits until everything but this benchmark uses fewer than `maxOtherCores` over a 1 s sample, or
 * `maxWaitMs` has passed. Sampling `/proc/stat` (not the load average, which still carries the
 * previous phase for a minute) isolates other engineers' work from our own idle processes.
 */
export const waitQuiet = async (
  maxOtherCores: number,
  maxWaitMs: number,
  postmasterPid: number | undefined,
  childPid: ChildPids
): Promise<QuietWait> => {
  const start = performance.now()
  let otherCores: number | undefined
  for (;;) {
    const a = readCpu(postmasterPid, childPid)
    await sleep(1000)
    otherCores = cpuDelta(a, readCpu(postmasterPid, childPid)).otherCores
    const waitedMs = performance.now() - start
    const quiet = otherCores === undefined || otherCores < maxOtherCores
    if (quiet || waitedMs >= maxWaitMs)
      return {
        waitedMs: Math.round(waitedMs),
        otherCores: otherCores === undefined ? undefined : Number(otherCores.toFixed(2)),
        quiet,
        load1: loadAverage()[0]!
      }
  }
}
