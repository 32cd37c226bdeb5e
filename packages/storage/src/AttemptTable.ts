/**
 * The attempts a worker session holds, in shared memory: the main thread writes an attempt in
 * when it is claimed and out when it is done with it; the heartbeats read the whole table once
 * per round. On the heartbeat thread that costs no message and no work per attempt: a drain paid
 * 5–9 µs of CPU per job for the `track` and `untrack` messages and the thread's bookkeeping of
 * them (docs/adr/0040-attempt-table.md).
 *
 * **Layout** Segments of `segmentSlots` slots. A slot is a job id and run lease (two entries of a
 * `BigInt64Array`), when the attempt was held (a `Float64Array`, ms since the epoch) and a version
 * (an `Int32Array`): odd while the slot holds an attempt, even while it is free, bumped by every
 * add and remove. A segment never moves or shrinks; the table grows by whole segments, each
 * announced through `onSegment` (its buffers are `SharedArrayBuffer`s: post them to a thread).
 *
 * **Guarantees** One writer: the thread that made the table. A reader sees an attempt as soon as
 * `add` returns (its fields are written before its version, an `Atomics.store`, and a reader loads
 * the version with `Atomics.load` first), and never a torn one: `forEachHeld` skips a slot whose
 * version changed while it read it. A handle (what `add` returns) names the slot and its version,
 * so `remove`, `isHeld` and `tokenOf` with the handle of an attempt removed since do nothing or
 * answer "not held", even once the slot holds another attempt. Versions wrap at 2^30: a handle
 * kept across 2^29 reuses of its slot could name the new attempt, and handles live only as long
 * as their attempt runs.
 */
import type { AttemptToken } from "./QueueStorage.ts"

/** Slots per segment. */
export const segmentSlots = 1024

/** Handles encode `version * slotLimit + slot`: exact as a double up to 2^30 versions. */
const slotLimit = 2 ** 21
const versionMask = 2 ** 30 - 1
const handleOf = (version: number, slot: number) => version * slotLimit + slot
const slotOf = (handle: number) => handle % slotLimit
const versionOf = (handle: number) => Math.floor(handle / slotLimit)

/** The shared memory of one segment: what a thread receives to read it. */
export interface SegmentBuffers {
  readonly index: number
  readonly ids: SharedArrayBuffer
  readonly heldAt: SharedArrayBuffer
  readonly versions: SharedArrayBuffer
}

interface Segment {
  readonly ids: BigInt64Array
  readonly heldAt: Float64Array
  readonly versions: Int32Array
}

const view = (buffers: SegmentBuffers): Segment => ({
  ids: new BigInt64Array(buffers.ids),
  heldAt: new Float64Array(buffers.heldAt),
  versions: new Int32Array(buffers.versions)
})

/** What a reader sees of each held attempt. */
export type HeldVisitor = (handle: number, jobId: bigint, runLease: bigint, heldAt: number) => void

/** The reading side, on any thread. */
export interface AttemptReader {
  /** Every attempt held now, each with its handle. */
  readonly forEachHeld: (visit: HeldVisitor) => void
  /** The attempt of this handle is still held. */
  readonly isHeld: (handle: number) => boolean
  /** The attempt of this handle, if it is still held. */
  readonly tokenOf: (handle: number) => AttemptToken | undefined
}

/** The writing side: the thread that made the table. */
export interface AttemptTable extends AttemptReader {
  /** Holds an attempt; the answer is its handle. */
  readonly add: (jobId: bigint, runLease: bigint, heldAt: number) => number
  /** Lets an attempt go; a handle of one already let go does nothing. */
  readonly remove: (handle: number) => void
  /** The segments so far, to hand to a reader on another thread. */
  readonly buffers: () => ReadonlyArray<SegmentBuffers>
  /** Attempts held now. */
  readonly size: () => number
}

const segmentOf = <S extends Segment | undefined>(segments: ReadonlyArray<S>, slot: number) =>
  segments[Math.floor(slot / segmentSlots)]

const readerOf = (segments: ReadonlyArray<Segment | undefined>): AttemptReader => {
  const isHeld = (handle: number) => {
    const slot = slotOf(handle)
    const segment = segmentOf(segments, slot)
    return segment !== undefined && Atomics.load(segment.versions, slot % segmentSlots) === versionOf(handle)
  }
  return {
    forEachHeld: (visit) => {
      for (let s = 0; s < segments.length; s++) {
        const segment = segments[s]
        if (segment === undefined) continue
        const { ids, heldAt, versions } = segment
        for (let i = 0; i < segmentSlots; i++) {
          const version = Atomics.load(versions, i)
          if ((version & 1) === 0) continue
          const jobId = Atomics.load(ids, 2 * i)
          const runLease = Atomics.load(ids, 2 * i + 1)
          const at = heldAt[i]!
          // removed (or removed and reused) while we read: skip it, it is not this attempt
          if (Atomics.load(versions, i) !== version) continue
          visit(handleOf(version, s * segmentSlots + i), jobId, runLease, at)
        }
      }
    },
    isHeld,
    tokenOf: (handle) => {
      const slot = slotOf(handle)
      const segment = segmentOf(segments, slot)
      if (segment === undefined) return undefined
      const i = slot % segmentSlots
      const version = versionOf(handle)
      if (Atomics.load(segment.versions, i) !== version) return undefined
      const token = {
        jobId: Atomics.load(segment.ids, 2 * i),
        runLease: Atomics.load(segment.ids, 2 * i + 1)
      }
      return Atomics.load(segment.versions, i) === version ? token : undefined
    }
  }
}

/** A reader of a table made on another thread; `addSegment` for each segment announced later. */
export const reader = (
  initial: ReadonlyArray<SegmentBuffers>
): AttemptReader & { readonly addSegment: (buffers: SegmentBuffers) => void } => {
  const segments: Array<Segment | undefined> = []
  // by index: a segment announced twice (a thread restarted meanwhile) is the same memory
  const addSegment = (buffers: SegmentBuffers) => {
    while (segments.length < buffers.index) segments.push(undefined)
    segments[buffers.index] = view(buffers)
  }
  for (const buffers of initial) addSegment(buffers)
  return { ...readerOf(segments), addSegment }
}

/** A table owned by the calling thread; `onSegment` is told of every segment added after the first. */
export const make = (onSegment: (buffers: SegmentBuffers) => void = () => {}): AttemptTable => {
  const segments: Array<Segment> = []
  const allBuffers: Array<SegmentBuffers> = []
  // free slots, a stack (the first segment's lowest on top at first, then the latest freed): a
  // segment is added only when more attempts are held at once than ever before
  const free: Array<number> = []
  let held = 0

  const grow = () => {
    const index = segments.length
    if ((index + 1) * segmentSlots > slotLimit)
      throw new Error(`more than ${slotLimit} attempts held at once`)
    const buffers: SegmentBuffers = {
      index,
      ids: new SharedArrayBuffer(segmentSlots * 2 * BigInt64Array.BYTES_PER_ELEMENT),
      heldAt: new SharedArrayBuffer(segmentSlots * Float64Array.BYTES_PER_ELEMENT),
      versions: new SharedArrayBuffer(segmentSlots * Int32Array.BYTES_PER_ELEMENT)
    }
    segments.push(view(buffers))
    allBuffers.push(buffers)
    for (let i = segmentSlots - 1; i >= 0; i--) free.push(index * segmentSlots + i)
    if (index > 0) onSegment(buffers)
  }
  grow()

  const add = (jobId: bigint, runLease: bigint, heldAt: number) => {
    if (free.length === 0) grow()
    const slot = free.pop()!
    const segment = segmentOf(segments, slot)!
    const i = slot % segmentSlots
    segment.ids[2 * i] = jobId
    segment.ids[2 * i + 1] = runLease
    segment.heldAt[i] = heldAt
    // the fields first, then the version that makes them visible (odd: held)
    const version = (segment.versions[i]! + 1) & versionMask
    Atomics.store(segment.versions, i, version)
    held++
    return handleOf(version, slot)
  }

  const remove = (handle: number) => {
    const slot = slotOf(handle)
    const segment = segmentOf(segments, slot)
    if (segment === undefined) return
    const i = slot % segmentSlots
    const version = versionOf(handle)
    if (segment.versions[i] !== version) return
    Atomics.store(segment.versions, i, (version + 1) & versionMask)
    free.push(slot)
    held--
  }

  return { ...readerOf(segments), add, remove, buffers: () => allBuffers, size: () => held }
}
