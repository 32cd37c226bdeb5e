/**
 * W3C `traceparent` codec (ADR-039): `00-<32 hex trace id>-<16 hex span id>-<2 hex flags>`.
 * Stored in job metadata under `awa:traceparent` at insert.
 */
export interface TraceContext {
  readonly traceId: string
  readonly spanId: string
  readonly sampled: boolean
}

export const metadataKey = "awa:traceparent"

const pattern = /^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$/
const zeroTraceId = "0".repeat(32)
const zeroSpanId = "0".repeat(16)

export const encode = (context: TraceContext): string =>
  `00-${context.traceId}-${context.spanId}-${context.sampled ? "01" : "00"}`

/** Parses a traceparent; anything malformed (or the all-zero ids the spec forbids) is `undefined`. */
export const decode = (value: unknown): TraceContext | undefined => {
  if (typeof value !== "string") return undefined
  const match = pattern.exec(value)
  // plain comparisons, not two more regular expressions: this runs for every attempt traced
  if (match === null || match[1] === zeroTraceId || match[2] === zeroSpanId) return undefined
  return { traceId: match[1]!, spanId: match[2]!, sampled: (Number.parseInt(match[3]!, 16) & 1) === 1 }
}
