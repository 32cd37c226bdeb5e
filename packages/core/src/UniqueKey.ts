/**
 * Unique-job keys (capabilities.md §4, ADR-002): a 16-byte BLAKE3 digest over the kind, then
 * (each preceded by a 0x00 separator) the queue, the canonical JSON of the encoded args and the
 * period bucket as a signed 64-bit little-endian integer, each only when selected. The byte layout
 * is a persistent format frozen by golden vectors in the tests.
 */
import { blake3 } from "@noble/hashes/blake3.js"
import { canonicalJson } from "./CanonicalJson.ts"

export interface UniqueKeyInput {
  readonly kind: string
  readonly queue?: string | undefined
  readonly args?: unknown
  /** The args' canonical JSON, when already rendered (`canonicalJson(args)`); wins over `args`. */
  readonly argsJson?: string | undefined
  readonly periodBucket?: bigint | undefined
}

const utf8 = new TextEncoder()

export const uniqueKey = (input: UniqueKeyInput): Uint8Array => {
  const parts: Array<Uint8Array> = [utf8.encode(input.kind)]
  const separator = new Uint8Array([0])
  if (input.queue !== undefined) parts.push(separator, utf8.encode(input.queue))
  if (input.argsJson !== undefined) parts.push(separator, utf8.encode(input.argsJson))
  else if (input.args !== undefined) parts.push(separator, utf8.encode(canonicalJson(input.args)))
  if (input.periodBucket !== undefined) {
    const bucket = new Uint8Array(8)
    new DataView(bucket.buffer).setBigInt64(0, input.periodBucket, true)
    parts.push(separator, bucket)
  }
  const total = parts.reduce((n, p) => n + p.length, 0)
  const message = new Uint8Array(total)
  let offset = 0
  for (const part of parts) {
    message.set(part, offset)
    offset += part.length
  }
  return blake3(message, { dkLen: 16 })
}

/** `floor(epochMillis / periodMillis)`, the period bucket of `byPeriod` uniqueness. */
export const periodBucket = (epochMillis: number, periodMillis: number): bigint =>
  BigInt(Math.floor(epochMillis / periodMillis))

export const toHex = (bytes: Uint8Array): string => Buffer.from(bytes).toString("hex")
