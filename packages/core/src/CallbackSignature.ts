/**
 * Signatures of callback requests (capabilities.md §18; docs/adr/0030-callbacks.md).
 *
 * - **id-only** (default): `x-awa-signature` = lowercase hex of keyed BLAKE3 (32-byte key) over
 *   the callback id. The HTTP worker sends it to the function with the callback URL; it is a
 *   capability token for that one callback, so the function needs no secret. It does not bind
 *   the payload or the action: whoever holds it may complete, fail or heartbeat that callback.
 * - **strict**: for callers that hold the secret. `x-awa-timestamp` = unix seconds, and
 *   `x-awa-signature` = keyed BLAKE3 over `v1\n<id>\n<action>\n<hex BLAKE3 of the body>\n<timestamp>`;
 *   accepted within ±300 s of the receiver's clock.
 *
 * Comparison is constant-time over the decoded 32 bytes; a header that is not 64 hex characters
 * is rejected before comparing.
 */
import { timingSafeEqual } from "node:crypto"
import { blake3 } from "@noble/hashes/blake3.js"
import { AwaConfigError, InvalidSignature } from "./AwaError.ts"

export const header = "x-awa-signature"
export const timestampHeader = "x-awa-timestamp"
/** Strict mode's accepted clock skew, in seconds. */
export const maxSkewSeconds = 300

const encoder = new TextEncoder()
const hexPattern = /^[0-9a-f]{64}$/

/** A signing key: 32 bytes, given as 64 hex characters. */
export interface SigningKey {
  readonly _tag: "SigningKey"
  readonly bytes: Uint8Array
}

/** Parses a secret of 64 hex characters (either case); anything else is `AwaConfigError`. */
export const keyFromHex = (secret: string, path = "signingSecret"): SigningKey | AwaConfigError =>
  /^[0-9a-fA-F]{64}$/.test(secret)
    ? { _tag: "SigningKey", bytes: Uint8Array.from(Buffer.from(secret, "hex")) }
    : new AwaConfigError({ issues: [{ path, reason: "must be 32 bytes given as 64 hex characters" }] })

const hex = (bytes: Uint8Array) => Buffer.from(bytes).toString("hex")

/** The id-only signature of a callback id. */
export const sign = (key: SigningKey, callbackId: string): string =>
  hex(blake3(encoder.encode(callbackId), { key: key.bytes }))

/** Unkeyed BLAKE3 of a request body, hex. */
export const bodyDigest = (body: Uint8Array | string): string =>
  hex(blake3(typeof body === "string" ? encoder.encode(body) : body))

/** The strict signature: id, action, body digest and timestamp (unix seconds). */
export const signStrict = (
  key: SigningKey,
  callbackId: string,
  action: string,
  body: Uint8Array | string,
  timestamp: number
): string =>
  hex(
    blake3(encoder.encode(`v1\n${callbackId}\n${action}\n${bodyDigest(body)}\n${timestamp}`), {
      key: key.bytes
    })
  )

const matches = (expected: string, given: string | undefined): InvalidSignature | undefined => {
  if (given === undefined || given === "") return new InvalidSignature({ reason: "missing" })
  if (!hexPattern.test(given)) return new InvalidSignature({ reason: "malformed" })
  return timingSafeEqual(Buffer.from(expected, "hex"), Buffer.from(given, "hex"))
    ? undefined
    : new InvalidSignature({ reason: "mismatch" })
}

/** Checks an id-only signature; `undefined` when it is valid. */
export const verify = (key: SigningKey, callbackId: string, given: string | undefined) =>
  matches(sign(key, callbackId), given)

/** Checks a strict signature at `nowSeconds`; `undefined` when it is valid. */
export const verifyStrict = (
  key: SigningKey,
  request: {
    readonly callbackId: string
    readonly action: string
    readonly body: Uint8Array | string
    readonly signature: string | undefined
    readonly timestamp: string | undefined
  },
  nowSeconds: number
): InvalidSignature | undefined => {
  const ts = request.timestamp === undefined ? Number.NaN : Number(request.timestamp)
  if (!Number.isInteger(ts)) return new InvalidSignature({ reason: "missing or malformed timestamp" })
  if (Math.abs(nowSeconds - ts) > maxSkewSeconds)
    return new InvalidSignature({ reason: "timestamp outside ±300 s" })
  return matches(signStrict(key, request.callbackId, request.action, request.body, ts), request.signature)
}
