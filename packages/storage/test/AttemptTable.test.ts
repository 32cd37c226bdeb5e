/**
 * The attempts' table the heartbeats read (`AttemptTable`, docs/adr/0040-attempt-table.md):
 * handles that stay exact when a slot is reused, growth by segments a reader on another thread
 * is told of, and a reader on another thread that sees an attempt once `add` returns and never a
 * torn one while the writer churns.
 */
import { Worker } from "node:worker_threads"
import { describe, expect, it } from "vitest"
import * as AttemptTable from "../src/AttemptTable.ts"

const leaseOf = (jobId: bigint) => jobId * 7n + 3n
const heldOf = (table: AttemptTable.AttemptReader) => {
  const held: Array<string> = []
  table.forEachHeld((handle, jobId, runLease) => held.push(`${handle}=${jobId}:${runLease}`))
  return held
}

describe("AttemptTable", () => {
  it("a handle names its attempt: once let go it does nothing, even after its slot is reused", () => {
    const table = AttemptTable.make()
    const a = table.add(1n, 1n, 100)
    table.remove(a)
    // the freed slot is the next one taken
    const b = table.add(2n, 5n, 200)
    expect(b).not.toBe(a)
    table.remove(a)
    expect(table.isHeld(a)).toBe(false)
    expect(table.tokenOf(a)).toBeUndefined()
    expect(table.isHeld(b)).toBe(true)
    expect(table.tokenOf(b)).toEqual({ jobId: 2n, runLease: 5n })
    expect(heldOf(table)).toEqual([`${b}=2:5`])
    expect(table.size()).toBe(1)
    table.remove(b)
    table.remove(b)
    expect(heldOf(table)).toEqual([])
    expect(table.size()).toBe(0)
  })

  it("grows by whole segments, each announced once; a reader of the announced buffers sees every attempt", () => {
    const announced: Array<AttemptTable.SegmentBuffers> = []
    const table = AttemptTable.make((buffers) => announced.push(buffers))
    const n = AttemptTable.segmentSlots * 2 + 500
    const handles = Array.from({ length: n }, (_, i) => table.add(BigInt(i), leaseOf(BigInt(i)), i))
    expect(announced.map((b) => b.index)).toEqual([1, 2])
    for (let i = 0; i < n; i += 2) table.remove(handles[i]!)
    // a reader started with the first segment, told of the others (one of them twice)
    const reader = AttemptTable.reader(table.buffers().slice(0, 1))
    for (const buffers of [...announced, announced[0]!]) reader.addSegment(buffers)
    const seen = new Map<number, bigint>()
    reader.forEachHeld((handle, jobId, runLease, heldAt) => {
      expect(runLease).toBe(leaseOf(jobId))
      expect(heldAt).toBe(Number(jobId))
      seen.set(handle, jobId)
    })
    expect(seen.size).toBe(n / 2)
    for (let i = 1; i < n; i += 2) expect(seen.get(handles[i]!)).toBe(BigInt(i))
    expect(reader.isHeld(handles[0]!)).toBe(false)
    expect(reader.tokenOf(handles[1]!)).toEqual({ jobId: 1n, runLease: leaseOf(1n) })
  })

  it("a reader on another thread sees what is held when it starts, and no torn attempt while the writer churns", async () => {
    const stop = new Int32Array(new SharedArrayBuffer(4))
    let worker: Worker | undefined
    const table = AttemptTable.make((buffers) => worker?.postMessage({ buffers }))
    table.add(10n, leaseOf(10n), 0)
    table.add(11n, leaseOf(11n), 0)
    worker = new Worker(new URL("./fixtures/attemptReader.thread.ts", import.meta.url), {
      workerData: { segments: table.buffers(), stop: stop.buffer }
    })
    const replies: Array<Reply> = []
    const reply = (t: string) =>
      new Promise<Reply>((resolve, reject) => {
        const look = () => {
          const found = replies.find((r) => r.t === t)
          if (found !== undefined) resolve(found)
          else setTimeout(look, 5)
        }
        worker!.once("error", reject)
        look()
      })
    worker.on("message", (m: Reply) => replies.push(m))
    try {
      expect(await reply("first")).toEqual({ t: "first", held: ["10:73", "11:80"] })
      // churn while it scans: between 200 and 3,000 held (two segments more, announced meanwhile)
      const held: Array<number> = []
      let id = 100n
      for (let round = 0; round < 1500; round++) {
        const target = round % 2 === 0 ? 3000 : 200
        while (held.length < target) {
          held.push(table.add(id, leaseOf(id), round))
          id++
        }
        while (held.length > target) table.remove(held.splice(Math.floor(held.length / 2), 1)[0]!)
      }
      Atomics.store(stop, 0, 1)
      const done = await reply("done")
      expect(done.seen).toBeGreaterThan(0)
      expect(done.torn).toBe(0)
    } finally {
      await worker.terminate()
    }
  })
})

interface Reply {
  readonly t: string
  readonly held?: ReadonlyArray<string>
  readonly scans?: number
  readonly seen?: number
  readonly torn?: number
}
