/**
 * The fault suite's callback scenarios (issue 21 item 5; docs/reliability.md):
 *
 * C1. 1,000 jobs dispatched in async mode by two worker processes to two instances of a real
 *     HTTP function on loopback. The function answers 202 and calls back at a random delay;
 *     some callbacks come twice, some first with a bad signature. One instance is killed
 *     mid-way (its pending callbacks are lost, its port refuses for a second) and comes back.
 *     Every job ends completed exactly once: one accepted callback per job, duplicates 409,
 *     bad signatures 401, lost callbacks time out and the job runs again.
 * C2. A parked job survives a worker `kill -9` and a Postgres restart, and still resolves.
 */
import { createServer, type Server } from "node:http"
import { CallbackSignature } from "@awa/core"
import { CallbackRoutes } from "@awa/effect"
import { Awa, AwaClient } from "@awa/runtime"
import { QueueStorage } from "@awa/storage"
import { EmbeddedPostgres, TestDatabase } from "@awa/testing"
import { PgClient } from "@effect/sql-pg"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Layer, Redacted } from "effect"
import { SqlClient } from "effect/sql"
import { createFaultLog, describeWorker, eventually, report, startWorkers, suiteLayer } from "./harness.ts"
import { Held, type WorkerConfig } from "./jobs.ts"

const secret = "5a".repeat(32)
const key = CallbackSignature.keyFromHex(secret) as CallbackSignature.SigningKey
const maintenance = {
  electionInterval: 500,
  promoteInterval: 50,
  rescueInterval: 200,
  rotateInterval: 1000
} as const

const freePort = () =>
  new Promise<number>((resolve) => {
    const s = createServer()
    s.listen(0, "127.0.0.1", () => {
      const { port } = s.address() as { port: number }
      s.close(() => resolve(port))
    })
  })

interface Accepted {
  readonly jobId: string
  readonly callbackId: string
  readonly callbackUrl: string
  readonly signature: string
}

/** Answers tallied per job: what the receiver said to each callback the function sent. */
interface Tally {
  readonly ok: Map<string, number>
  readonly stale: Array<string>
  readonly unauthorized: Array<string>
  readonly other: Array<string>
}

/**
 * One instance of the "serverless function": 202 to every job, then calls back after a random
 * delay (0–500 ms): 10 % first with a bad signature, 10 % twice. `kill` closes it and drops the
 * callbacks it has not sent.
 */
const functionInstance = (port: number, tally: Tally, onAccept: (a: Accepted) => void) => {
  const timers = new Set<NodeJS.Timeout>()
  // An instance sends at most 16 callbacks at once and retries a failed connection, as a real
  // function's HTTP client would; unbounded, a thousand callbacks in one second overflowed the
  // receiver's listen backlog.
  let active = 0
  const queued: Array<() => void> = []
  const slot = () =>
    new Promise<void>((resolve) => {
      if (active < 16) {
        active++
        resolve()
      } else queued.push(resolve)
    })
  const free = () => {
    const next = queued.shift()
    if (next === undefined) active--
    else next()
  }
  const post = async (url: string, signature: string): Promise<number> => {
    await slot()
    try {
      for (let attempt = 1; ; attempt++) {
        try {
          const r = await fetch(url, {
            method: "POST",
            headers: { "content-type": "application/json", [CallbackSignature.header]: signature },
            body: JSON.stringify({ payload: { ok: true } })
          })
          return r.status
        } catch (error) {
          if (attempt >= 5) throw error
          await new Promise((r) => setTimeout(r, 100 * attempt))
        }
      }
    } finally {
      free()
    }
  }
  const callBack = async (a: Accepted, roll: number) => {
    if (roll < 0.1) {
      const status = await post(
        `${a.callbackUrl}/complete`,
        CallbackSignature.sign(key, `${a.callbackId}-forged`)
      )
      if (status === 401) tally.unauthorized.push(a.jobId)
      else tally.other.push(`${a.jobId}: forged ${status}`)
    }
    const times = roll > 0.9 ? 2 : 1
    for (let i = 0; i < times; i++) {
      const status = await post(`${a.callbackUrl}/complete`, a.signature)
      if (status === 200) tally.ok.set(a.jobId, (tally.ok.get(a.jobId) ?? 0) + 1)
      // 409 stale; 404 once the stale attempt's ring slot is reclaimed (a callback that came
      // after its timeout, when the job had already run again)
      else if (status === 409 || status === 404) tally.stale.push(a.jobId)
      else tally.other.push(`${a.jobId}: ${status}`)
    }
  }
  const server: Server = createServer((req, res) => {
    let text = ""
    req.on("data", (c) => (text += c))
    req.on("end", () => {
      const body = JSON.parse(text)
      const a: Accepted = {
        jobId: body.jobId,
        callbackId: body.callbackId,
        callbackUrl: body.callbackUrl,
        signature: String(req.headers[CallbackSignature.header])
      }
      onAccept(a)
      res.writeHead(202).end("{}")
      const timer = setTimeout(
        () => {
          timers.delete(timer)
          void callBack(a, Math.random()).catch((e) => tally.other.push(`${a.jobId}: ${String(e)}`))
        },
        Math.floor(Math.random() * 500)
      )
      timers.add(timer)
    })
  })
  const started = new Promise<void>((resolve) => server.listen(port, "127.0.0.1", () => resolve()))
  return {
    started,
    kill: () =>
      new Promise<number>((resolve) => {
        const dropped = timers.size
        for (const t of timers) clearTimeout(t)
        timers.clear()
        server.closeAllConnections()
        server.close(() => resolve(dropped))
      })
  }
}

const httpKind = (url: string, base: string, callbackTimeout: number) => ({
  kind: "fn",
  options: { url, mode: "async", signingSecret: secret, callbackBaseUrl: base, callbackTimeout, queue: "fn" }
})

const workerConfig = (name: string, http: ReturnType<typeof httpKind>, extra: object = {}): WorkerConfig => ({
  name,
  http: [http],
  options: {
    queues: { fn: { maxConcurrency: 100 }, held: { maxConcurrency: 5 } },
    heartbeatInterval: 300,
    heartbeatStaleness: 1500,
    maintenance,
    shutdownTimeout: 5000,
    ...extra
  }
})

const states = Effect.flatMap(
  SqlClient.SqlClient,
  (sql) => sql<{ state: string; n: number }>`SELECT state, count(*)::int AS n FROM awa.jobs GROUP BY state`
)

describe("faults: callbacks", () => {
  it.live(
    "C1. 1,000 async HTTP jobs, random callback delays, duplicates, forged signatures, one function instance killed: every job completed once",
    () =>
      Effect.gen(function* () {
        const started = Date.now()
        const { url } = yield* TestDatabase.acquire()
        const receiverPort = yield* Effect.promise(freePort)
        const portA = yield* Effect.promise(freePort)
        const portB = yield* Effect.promise(freePort)
        const base = `http://127.0.0.1:${receiverPort}`
        const tally: Tally = { ok: new Map(), stale: [], unauthorized: [], other: [] }
        const accepted = new Map<string, number>()
        const accept = (a: Accepted) => accepted.set(a.jobId, (accepted.get(a.jobId) ?? 0) + 1)
        let a = functionInstance(portA, tally, accept)
        const b = functionInstance(portB, tally, accept)
        yield* Effect.promise(() => Promise.all([a.started, b.started]))
        yield* Effect.addFinalizer(() => Effect.promise(() => Promise.all([a.kill(), b.kill()])))
        yield* Effect.gen(function* () {
          yield* createFaultLog
          const workers = yield* startWorkers(url, [
            // 20 s: longer than callbacks queue on a loaded 2-core machine (at 5 s, callbacks that
            // queued behind others timed out, the jobs ran again, which queued more callbacks)
            workerConfig("w1", httpKind(`http://127.0.0.1:${portA}/`, base, 20_000)),
            workerConfig("w2", httpKind(`http://127.0.0.1:${portB}/`, base, 20_000))
          ])
          const client = yield* AwaClient.AwaClient
          const total = 1000
          yield* client.storage.enqueueMany(
            Array.from({ length: total }, (_, n) => ({ kind: "fn", queue: "fn", args: { n } }))
          )
          // kill instance A once about a third of the jobs were handed to the functions
          yield* eventually(
            Effect.sync(() => accepted.size >= total / 3),
            120_000,
            20
          )
          const dropped = yield* Effect.promise(() => a.kill())
          yield* Effect.sleep("1 second")
          a = functionInstance(portA, tally, accept)
          yield* Effect.promise(() => a.started)
          const done = yield* eventually(
            Effect.map(states, (rows) => rows.some((r) => r.state === "completed" && r.n === total)),
            240_000,
            250
          )
          const byState = Object.fromEntries((yield* states).map((r) => [r.state, r.n]))
          const storage = yield* QueueStorage
          const jobs = yield* storage.listJobs({ queue: "fn", limit: 1000 })
          const reran = jobs.filter((j) => j.attempt > 1).length
          const twice = [...tally.ok.values()].filter((n) => n > 1).length
          yield* report("callbacks-http", {
            scenario: "1,000 async HTTP jobs; a function instance killed and restarted",
            jobs: total,
            completed: byState.completed ?? 0,
            failed: byState.failed ?? 0,
            duplicates: twice,
            extraExecutions: reran,
            retries: reran,
            lost: total - (byState.completed ?? 0),
            recoveryMs: null,
            wallMs: Date.now() - started,
            notes:
              `${dropped} callbacks dropped by the kill; ${reran} jobs dispatched more than once (lost callbacks timed out, ` +
              `refused requests retried); ${tally.stale.length} duplicate callbacks answered 409, ` +
              `${tally.unauthorized.length} forged ones 401`
          })
          assert.isTrue(
            done,
            `not all completed: ${JSON.stringify(byState)}\n${workers.map((w) => describeWorker(w)).join("\n")}`
          )
          assert.deepStrictEqual(byState, { completed: total })
          // exactly one accepted callback per job: every completion came from one callback
          assert.strictEqual(tally.ok.size, total)
          assert.strictEqual(twice, 0, "a job accepted two callbacks")
          assert.isAbove(tally.stale.length, 0, "duplicates were sent")
          assert.isAbove(tally.unauthorized.length, 0, "forged signatures were sent")
          assert.deepStrictEqual(tally.other, [], "unexpected answers")
          assert.isAbove(dropped + reran, 0, "the kill cost something")
        }).pipe(
          Effect.provide(
            Layer.merge(
              // the receiver on a pool of its own (the suite's has 4 connections)
              CallbackRoutes.serve({ port: receiverPort, auth: { secret } }).pipe(
                Layer.provide(
                  Awa.layerPg().pipe(
                    Layer.provideMerge(PgClient.layer({ url: Redacted.make(url), maxConnections: 12 }))
                  )
                )
              ),
              suiteLayer(url)
            )
          )
        )
      }).pipe(Effect.scoped),
    300_000
  )

  it.live(
    "C2. a parked job survives a worker kill -9 and a Postgres restart, and its callback still completes it",
    () =>
      Effect.gen(function* () {
        const server = yield* Effect.acquireRelease(
          Effect.promise(() => EmbeddedPostgres.startTemporary()),
          (s) => Effect.promise(() => s.stop())
        )
        const url = server.url
        const fnPort = yield* Effect.promise(freePort)
        const receiverPort = yield* Effect.promise(freePort)
        const base = `http://127.0.0.1:${receiverPort}`
        // a function that accepts and never calls back by itself
        const seen: Array<Accepted> = []
        const fn = createServer((req, res) => {
          let text = ""
          req.on("data", (c) => (text += c))
          req.on("end", () => {
            const body = JSON.parse(text)
            seen.push({
              jobId: body.jobId,
              callbackId: body.callbackId,
              callbackUrl: body.callbackUrl,
              signature: String(req.headers[CallbackSignature.header])
            })
            res.writeHead(202).end("{}")
          })
        })
        yield* Effect.promise(() => new Promise<void>((r) => fn.listen(fnPort, "127.0.0.1", () => r())))
        yield* Effect.addFinalizer(() => Effect.promise(() => new Promise<void>((r) => fn.close(() => r()))))
        yield* Effect.gen(function* () {
          yield* createFaultLog
          const http = httpKind(`http://127.0.0.1:${fnPort}/`, base, 3_600_000)
          const [w1] = yield* startWorkers(url, [workerConfig("w1", http)])
          const client = yield* AwaClient.AwaClient
          const storage = yield* QueueStorage
          const [parked] = yield* client.storage.enqueueMany([{ kind: "fn", queue: "fn", args: { n: 1 } }])
          // and a running job, whose rescue shows that the new leader's stale sweep ran
          const running = yield* client.insert(Held, { maxMs: 600_000 }, { queue: "held" })
          const isState = (id: bigint, state: string) =>
            Effect.map(storage.getJob(id), (v) => v.state === state)
          assert.isTrue(yield* eventually(isState(parked!.id, "waiting_external"), 60_000, 50), "parked")
          assert.isTrue(yield* eventually(isState(running.id, "running"), 60_000, 50), "held job running")
          w1!.child.kill("SIGKILL")
          yield* Effect.promise(() => w1!.exited)
          yield* Effect.promise(() => server.restart!({ downtimeMs: 2000 }))
          yield* startWorkers(url, [workerConfig("w2", http)])
          // the held job was rescued as stale (no heartbeats after the kill): the sweep ran
          assert.isTrue(
            yield* eventually(
              Effect.map(storage.getJob(running.id), (v) =>
                v.errors.some((e) => e.error.startsWith("heartbeat stale"))
              ),
              60_000,
              100
            ),
            "the stale sweep ran"
          )
          const view = yield* storage.getJob(parked!.id)
          assert.deepStrictEqual([view.state, view.attempt, view.errors.length], ["waiting_external", 1, 0])
          const a = seen.find((s) => s.jobId === String(parked!.id))!
          const r = yield* Effect.promise(() =>
            fetch(`${a.callbackUrl}/complete`, {
              method: "POST",
              headers: { "content-type": "application/json", [CallbackSignature.header]: a.signature },
              body: "{}"
            })
          )
          assert.strictEqual(r.status, 200)
          assert.strictEqual((yield* storage.getJob(parked!.id)).state, "completed")
          yield* Effect.sync(() =>
            console.log("C2: parked job resolved after worker kill -9 and Postgres restart")
          )
        }).pipe(
          Effect.provide(
            CallbackRoutes.serve({ port: receiverPort, auth: { secret } }).pipe(
              Layer.provideMerge(suiteLayer(url, { migrateOnStart: true }))
            )
          )
        )
      }).pipe(Effect.scoped),
    300_000
  )
})
