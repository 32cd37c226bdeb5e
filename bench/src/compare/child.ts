/**
 * One system's Node process: `node bench/src/compare/child.ts <system> <database url>`, forked by
 * `compare.ts` with an IPC channel; `AWA_BENCH_PROFILE` is Awa's profile (default `tuned`). It
 * runs the requests of `protocol.ts` one at a time against its adapter and counts every handler
 * start per job (`seq`), so the orchestrator can check that each job ran exactly once (summed
 * over processes in the scale phase: `executions`).
 */
import { now, quantile, round, sum, summarize } from "../lib.ts"
import { factories } from "../systems/factories.ts"
import { type Profile, profiles, queueName, type SystemAdapter, type SystemName } from "../systems/types.ts"
import type {
  DrainTimes,
  Executions,
  Latencies,
  Request,
  Response,
  Sample,
  Timed,
  Verification
} from "./protocol.ts"

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms))

/** Handler starts: per seq, how many times and when first. */
const executions = new Map<number, number>()
const firstStart = new Map<number, number>()
let total = 0
let waiter: { readonly target: number; readonly resolve: (at: number) => void } | undefined
let firstAfter: { readonly since: number; at: number | undefined } | undefined

/** Soak: commit times of produced jobs not yet sampled, and the jobs first started since the last sample. */
const soak = { offered: 0, committed: 0, insertErrors: 0, committedAt: new Map<number, number>() }
let startedSinceSample: Array<number> = []

const onStart = (seq: number) => {
  const at = now()
  total++
  const n = executions.get(seq) ?? 0
  executions.set(seq, n + 1)
  if (n === 0) {
    firstStart.set(seq, at)
    if (soak.offered > 0) startedSinceSample.push(seq)
  }
  if (firstAfter !== undefined && firstAfter.at === undefined) firstAfter.at = at
  if (waiter !== undefined && total >= waiter.target) {
    const w = waiter
    waiter = undefined
    w.resolve(at)
  }
}

/** Resolves with the time of the handler start that brought `total` to `target`. */
const executionsReach = (target: number, timeoutMs: number): Promise<number> =>
  new Promise((resolve, reject) => {
    if (total >= target) return resolve(now())
    const timer = setTimeout(() => {
      waiter = undefined
      reject(new Error(`timed out after ${timeoutMs} ms: ${total} of ${target} handler starts`))
    }, timeoutMs)
    waiter = {
      target,
      resolve: (at) => {
        clearTimeout(timer)
        resolve(at)
      }
    }
  })

/** Resolves once the adapter's acknowledged completions reach `target` (polled every millisecond). */
const untilCompletions = async (completions: () => number, target: number, deadline: number) => {
  while (completions() < target) {
    if (now() > deadline) throw new Error(`timed out at ${completions()} of ${target} completions`)
    await sleep(1)
  }
}

const untilNoOpenJobs = async (adapter: SystemAdapter, deadline: number) => {
  for (;;) {
    const open = await adapter.openJobs()
    if (open === 0) return
    if (now() > deadline) throw new Error(`timed out with ${open} jobs still open`)
    await sleep(20)
  }
}

const range = (from: number, count: number) => Array.from({ length: count }, (_, i) => from + i)

const main = async () => {
  const system = process.argv[2] as SystemName
  const url = process.argv[3]!
  const factory = factories[system]
  if (factory === undefined || url === undefined) throw new Error("usage: child.ts <system> <database url>")
  const profile = (process.env.AWA_BENCH_PROFILE ?? "tuned") as Profile
  if (!profiles.includes(profile)) throw new Error(`AWA_BENCH_PROFILE: unknown ${profile}`)
  const adapter = await (await factory())(url, { profile })
  let running = false

  const startWorkers = async (concurrency?: number) => {
    if (running) return
    await adapter.startWorkers(onStart, concurrency)
    running = true
  }
  const stopWorkers = async () => {
    if (!running) return
    running = false
    await adapter.stopWorkers()
  }

  const handle = async (request: Request): Promise<unknown> => {
    switch (request.op) {
      case "describe":
        return { name: adapter.name, version: adapter.version, settings: adapter.settings }
      case "install":
        return adapter.install()
      case "enqueueSequential": {
        const seqs = range(request.from, request.count)
        const start = now()
        await adapter.enqueueSequential(seqs)
        return { ms: now() - start } satisfies Timed
      }
      case "enqueueBatches": {
        const samples: Array<number> = []
        const start = now()
        for (let i = 0; i < request.count; i += request.chunk) {
          const seqs = range(request.from + i, Math.min(request.chunk, request.count - i))
          const t = now()
          await adapter.enqueueBatch(seqs)
          samples.push(now() - t)
        }
        return { ms: now() - start, calls: summarize(samples) } satisfies Timed
      }
      case "enqueueConcurrent": {
        const samples: Array<number> = []
        const producer = async (p: number) => {
          const queue = queueName(p % request.queues)
          for (let i = p; i < request.count; i += request.producers) {
            const t = now()
            await adapter.enqueueOne(request.from + i, queue)
            samples.push(now() - t)
          }
        }
        const start = now()
        await Promise.all(Array.from({ length: request.producers }, (_, p) => producer(p)))
        return { ms: now() - start, calls: summarize(samples) } satisfies Timed
      }
      case "startWorkers":
        return startWorkers(request.concurrency)
      case "stopWorkers": {
        const start = now()
        await stopWorkers()
        return { ms: now() - start } satisfies Timed
      }
      case "runUntilDone": {
        const start = now()
        const deadline = start + request.timeoutMs
        firstAfter = { since: start, at: undefined }
        const reached = executionsReach(total + request.expected, request.timeoutMs)
        // the system's own count of acknowledged completions where it has one (the phase checks
        // storage for open jobs after the interval); else storage's open jobs, polled
        const completions = adapter.completions
        const target = completions === undefined ? 0 : completions() + request.expected
        await startWorkers()
        const lastStart = await reached
        if (completions !== undefined) await untilCompletions(completions, target, deadline)
        else await untilNoOpenJobs(adapter, deadline)
        const end = now()
        const first = firstAfter.at ?? lastStart
        firstAfter = undefined
        return {
          ms: end - start,
          firstStartMs: first - start,
          lastStartMs: lastStart - start,
          settleMs: end - lastStart
        } satisfies DrainTimes
      }
      case "offer": {
        await startWorkers()
        const n = Math.round(request.rate * request.seconds)
        const interval = 1000 / request.rate
        const sentAt = new Float64Array(n)
        const committedAt = new Float64Array(n)
        const reached = executionsReach(total + n, request.timeoutMs + request.seconds * 1000)
        const inserts: Array<Promise<void>> = []
        const t0 = now() + 5
        let maxLag = 0
        for (let i = 0; i < n; i++) {
          const due = t0 + i * interval
          const wait = due - now()
          if (wait > 0) await sleep(wait)
          const sent = now()
          maxLag = Math.max(maxLag, sent - due)
          sentAt[i] = sent
          inserts.push(
            adapter.enqueueOne(request.from + i).then(() => {
              committedAt[i] = now()
            })
          )
        }
        await Promise.all(inserts)
        await reached
        await untilNoOpenJobs(adapter, now() + request.timeoutMs)
        const pickup: Array<number> = []
        const sendToStart: Array<number> = []
        const insert: Array<number> = []
        for (let i = 0; i < n; i++) {
          const started = firstStart.get(request.from + i)
          if (started === undefined) throw new Error(`job ${request.from + i} never started`)
          pickup.push(started - committedAt[i]!)
          sendToStart.push(started - sentAt[i]!)
          insert.push(committedAt[i]! - sentAt[i]!)
        }
        pickup.sort((a, b) => a - b)
        sendToStart.sort((a, b) => a - b)
        const q = (values: ReadonlyArray<number>, p: number) => round(quantile(values, p), 3)
        return {
          offered: n,
          offerSeconds: request.seconds,
          pickup: {
            p50: q(pickup, 0.5),
            p95: q(pickup, 0.95),
            p99: q(pickup, 0.99),
            max: q(pickup, 1),
            min: round(pickup[0] ?? 0, 3),
            mean: round(sum(pickup) / Math.max(1, n), 3)
          },
          sendToStart: { p50: q(sendToStart, 0.5), p99: q(sendToStart, 0.99), max: q(sendToStart, 1) },
          insert: summarize(insert),
          maxScheduleLagMs: round(maxLag, 3)
        } satisfies Latencies
      }
      case "verify": {
        let executedOnce = 0
        let missing = 0
        let duplicates = 0
        let inRanges = 0
        for (const r of request.ranges) {
          for (let seq = r.from; seq < r.from + r.count; seq++) {
            const c = executions.get(seq) ?? 0
            inRanges += c
            if (c === 0) missing++
            else if (c === 1) executedOnce++
            else duplicates += c - 1
          }
        }
        return {
          expected: sum(request.ranges.map((r) => r.count)),
          executedOnce,
          missing,
          duplicates,
          outside: total - inRanges
        } satisfies Verification
      }
      case "openJobs":
        return adapter.openJobs()
      case "executions":
        return {
          counts: request.ranges.map((r) => range(r.from, r.count).map((seq) => executions.get(seq) ?? 0)),
          total
        } satisfies Executions
      case "total":
        return total
      case "completions":
        return adapter.completions?.() ?? -1
      case "produce": {
        await startWorkers()
        const n = Math.round(request.rate * request.seconds)
        const interval = 1000 / request.rate
        let outstanding = 0
        const t0 = now() + 5
        for (let i = 0; i < n; i++) {
          const due = t0 + i * interval
          const wait = due - now()
          if (wait > 0) await sleep(wait)
          const seq = request.from + i
          soak.offered++
          outstanding++
          adapter.enqueueOne(seq).then(
            () => {
              outstanding--
              soak.committed++
              soak.committedAt.set(seq, now())
            },
            () => {
              outstanding--
              soak.insertErrors++
            }
          )
        }
        while (outstanding > 0) await sleep(10)
        return { ms: now() - t0 } satisfies Timed
      }
      case "sample": {
        const pickup: Array<number> = []
        const pending: Array<number> = []
        for (const seq of startedSinceSample) {
          const committed = soak.committedAt.get(seq)
          if (committed === undefined) {
            pending.push(seq) // started before its producer saw the commit: next sample
            continue
          }
          soak.committedAt.delete(seq)
          pickup.push(firstStart.get(seq)! - committed)
          firstStart.delete(seq)
        }
        startedSinceSample = pending
        pickup.sort((a, b) => a - b)
        return {
          offered: soak.offered,
          committed: soak.committed,
          insertErrors: soak.insertErrors,
          executed: total,
          pickup: {
            count: pickup.length,
            p50: round(quantile(pickup, 0.5), 2),
            p99: round(quantile(pickup, 0.99), 2),
            max: round(pickup.at(-1) ?? 0, 2)
          }
        } satisfies Sample
      }
      case "settle": {
        const start = now()
        await executionsReach(request.total, request.timeoutMs)
        await untilNoOpenJobs(adapter, start + request.timeoutMs)
        return { ms: now() - start } satisfies Timed
      }
      case "close": {
        await stopWorkers()
        await adapter.close()
        return undefined
      }
    }
  }

  process.on("message", (message: { id: number; request: Request }) => {
    handle(message.request).then(
      (value) => {
        const response: Response = { id: message.id, ok: true, value: value ?? null }
        process.send!(response, () => {
          if (message.request.op === "close") process.exit(0)
        })
      },
      (error: unknown) => {
        const response: Response = {
          id: message.id,
          ok: false,
          error: error instanceof Error ? (error.stack ?? error.message) : String(error)
        }
        process.send!(response)
      }
    )
  })
  process.send!({ id: 0, ok: true, value: "ready" } satisfies Response)
}

process.on("disconnect", () => process.exit(3))
main().catch((error: unknown) => {
  console.error(error)
  process.exit(2)
})
