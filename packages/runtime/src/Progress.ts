/**
 * A handler's progress (capability 14): `{ percent?, message?, metadata? }`, checked and sized
 * before it replaces the attempt's current value. Pure: the executor keeps the value, heartbeats
 * and finalization write it.
 *
 * **Guarantees** A value that leaves here is a JSON object jsonb can store (canonical JSON walk:
 * no `bigint`, cycles, class instances or NUL characters) of at most `maxBytes` UTF-8 bytes; a
 * rejected update leaves the current value as it was.
 */
import { CanonicalJson, ProgressTooLarge, ValidationError } from "@awa/core"

/** What a handler reports, and what the next attempt reads back as `ctx.job.progress`. */
export type JobProgress = {
  /** 0–100. */
  readonly percent?: number | undefined
  readonly message?: string | undefined
  /** Checkpoint data: merged shallowly by `updateMetadata`. */
  readonly metadata?: Readonly<Record<string, unknown>> | undefined
}

/** Longest progress message (capabilities.md §14, chosen). */
export const maxMessageLength = 1000

/** `maxProgressBytes`: default and range (capabilities.md §14: 64 KiB, 1 KiB – 1 MiB). */
export const maxBytesRange = { min: 1024, max: 1_048_576, default: 65_536 } as const

const utf8 = new TextEncoder()

/** Checks `next` as a whole: JSON jsonb accepts, within `maxBytes`. */
const sized = (next: JobProgress, maxBytes: number): JobProgress | ValidationError | ProgressTooLarge => {
  let json: string
  try {
    json = CanonicalJson.canonicalJson(next, "progress")
  } catch (e) {
    return new ValidationError({
      field: e instanceof CanonicalJson.JsonError ? e.path : "progress",
      reason: String(e instanceof Error ? e.message : e)
    })
  }
  // bytes ≥ characters: only long strings need encoding to be measured
  const bytes = json.length * 3 <= maxBytes ? json.length : utf8.encode(json).length
  return bytes > maxBytes ? new ProgressTooLarge({ bytes, maxBytes }) : next
}

/** `setProgress(percent, message?)`: percent clamped to 0–100, message replaced (or removed). */
export const withPercent = (
  current: JobProgress | null,
  percent: number,
  message: string | undefined,
  maxBytes: number
): JobProgress | ValidationError | ProgressTooLarge => {
  if (typeof percent !== "number" || !Number.isFinite(percent))
    return new ValidationError({
      field: "percent",
      reason: `must be a finite number (got ${String(percent)})`
    })
  if (message !== undefined && (typeof message !== "string" || message.length > maxMessageLength))
    return new ValidationError({
      field: "message",
      reason: `must be a string of at most ${maxMessageLength} characters`
    })
  const clamped = Math.min(100, Math.max(0, percent))
  const metadata = current?.metadata
  return sized(
    {
      percent: clamped,
      ...(message === undefined ? {} : { message }),
      ...(metadata === undefined ? {} : { metadata })
    },
    maxBytes
  )
}

/** `updateMetadata(patch)`: shallow merge into the metadata; percent and message kept. */
export const withMetadata = (
  current: JobProgress | null,
  patch: Readonly<Record<string, unknown>>,
  maxBytes: number
): JobProgress | ValidationError | ProgressTooLarge => {
  if (typeof patch !== "object" || patch === null || Array.isArray(patch))
    return new ValidationError({ field: "metadata", reason: "must be a JSON object" })
  return sized({ ...current, metadata: { ...current?.metadata, ...patch } }, maxBytes)
}
