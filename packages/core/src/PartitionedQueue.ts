/**
 * Partitioned queues (capabilities.md §22, docs/adr/0035-partitioned-queues.md): one logical queue
 * spread over `partitions` physical queues, `logical`, `logical__p1`, …, `logical__p{n-1}`, so
 * that producers and claimers of one hot logical queue work on separate queues (separate lanes,
 * locks and dispatchers), where sharding (`enqueueShards`) spreads one queue over lanes.
 *
 * - **Routing** `routeByKey(key)` picks a partition from a digest of the key and returns the
 *   insert options `{ queue, orderingKey }`: one key's jobs share a partition and, in a sharded
 *   partition, a shard, and keep their insert order. The digest has its own domain
 *   (`awa.partition.v1`, BLAKE3), unrelated to the shard's (`hashtextextended('shard' …)` in SQL),
 *   so partitions and shards of the same keys are uncorrelated: with 4 × 4, keys reach all 16.
 *   `routeByIndex(i)` takes partition `i` modulo the count (round robin, or a caller's own map).
 * - **Workers** `workerQueues(config)` is the worker's `queues` entry for every partition with
 *   the same config (each partition is a queue of its own: `maxConcurrency`, `weight`, rate
 *   limits and the rest apply per partition).
 * - **What is not shared** Each partition is a queue: its own FIFO per lane, pause, statistics
 *   and overrides. Nothing is stored about the grouping: producers and workers agree by using the
 *   same definition (as with a job definition's queue). Changing the count re-routes keys.
 */
import { blake3 } from "@noble/hashes/blake3.js"
import { Effect } from "effect"
import { ValidationError } from "./AwaError.ts"
import { checkName, limits as jobLimits } from "./NewJob.ts"

export const limits = {
  minPartitions: 1,
  /** chosen (capabilities.md §22) */
  maxPartitions: 256
} as const

/** The suffix of partition `i` ≥ 1 (partition 0 is the logical name itself). */
const suffix = (i: number) => `__p${i}`

export interface PartitionedQueue {
  readonly logical: string
  readonly partitions: number
  /** The physical queue names, partition 0 first: `logical`, `logical__p1`, … */
  readonly queues: ReadonlyArray<string>
  /** The partition of a key: a digest of it modulo `partitions`. */
  readonly partitionOf: (key: string) => number
  /** Insert options for a job with this key: its partition's queue, and the key as ordering key. */
  readonly routeByKey: (key: string) => { readonly queue: string; readonly orderingKey: string }
  /** Insert options for partition `index` modulo `partitions` (an integer; negative ones too). */
  readonly routeByIndex: (index: number) => { readonly queue: string }
  /** A worker's `queues` entry for every partition, each with `config`. */
  readonly workerQueues: <C>(config: C) => Record<string, C>
}

const utf8 = new TextEncoder()
const domain = utf8.encode("awa.partition.v1\u001f")

/** First four bytes of BLAKE3("awa.partition.v1" 0x1f key), big-endian, modulo `n`. */
export const partitionOfKey = (key: string, n: number): number => {
  const body = utf8.encode(key)
  const message = new Uint8Array(domain.length + body.length)
  message.set(domain, 0)
  message.set(body, domain.length)
  const d = blake3(message, { dkLen: 4 })
  return (((d[0]! << 24) | (d[1]! << 16) | (d[2]! << 8) | d[3]!) >>> 0) % n
}

/** The definition, or why it is not one. */
const build = (logical: string, partitions: number): PartitionedQueue | ValidationError => {
  const badName = checkName("queue", logical)
  if (badName !== undefined) return badName
  if (
    !Number.isInteger(partitions) ||
    partitions < limits.minPartitions ||
    partitions > limits.maxPartitions
  ) {
    return new ValidationError({
      field: "partitions",
      reason: `must be an integer ${limits.minPartitions}–${limits.maxPartitions} (got ${partitions})`
    })
  }
  const longest = logical + (partitions > 1 ? suffix(partitions - 1) : "")
  if (longest.length > jobLimits.nameMaxLength) {
    return new ValidationError({
      field: "queue",
      reason: `partition name "${longest}" is longer than ${jobLimits.nameMaxLength} characters`
    })
  }
  const queues = Array.from({ length: partitions }, (_, i) => (i === 0 ? logical : logical + suffix(i)))
  const partitionOf = (key: string) => partitionOfKey(key, partitions)
  return {
    logical,
    partitions,
    queues,
    partitionOf,
    routeByKey: (key) => ({ queue: queues[partitionOf(key)]!, orderingKey: key }),
    routeByIndex: (index) => {
      if (!Number.isInteger(index)) throw new RangeError(`routeByIndex needs an integer (got ${index})`)
      return { queue: queues[((index % partitions) + partitions) % partitions]! }
    },
    workerQueues: <C>(config: C) => Object.fromEntries(queues.map((q) => [q, config])) as Record<string, C>
  }
}

/**
 * A partitioned queue. Fails with `ValidationError` when `partitions` is not an integer
 * 1–256 or a physical name would break the queue-name rules (1–200 characters, no NUL, no
 * leading or trailing whitespace: the logical name plus `__p255` must fit).
 */
export const make = (logical: string, partitions: number): Effect.Effect<PartitionedQueue, ValidationError> =>
  Effect.suspend(() => {
    const built = build(logical, partitions)
    return built instanceof ValidationError ? Effect.fail(built) : Effect.succeed(built)
  })

/** `make` for code without Effect (the Promise facade's way): throws the `ValidationError`. */
export const makeUnsafe = (logical: string, partitions: number): PartitionedQueue => {
  const built = build(logical, partitions)
  if (built instanceof ValidationError) throw built
  return built
}
