import { describe, expect, it } from "@effect/vitest"
import { Effect } from "effect"
import fc from "fast-check"
import { backoffBounds, defaultBackoffMs, effectivePriority } from "../src/Backoff.ts"
import { canonicalJson, compareUtf8 } from "../src/CanonicalJson.ts"
import { deriveKind } from "../src/Job.ts"
import { checkNewJob } from "../src/NewJob.ts"
import * as Traceparent from "../src/Traceparent.ts"
import { toHex, uniqueKey } from "../src/UniqueKey.ts"

describe("deriveKind", () => {
  it("turns CamelCase type names into snake_case kinds (golden cases)", () => {
    expect(deriveKind("SMTPEmail")).toBe("smtp_email")
    expect(deriveKind("OAuthRefresh")).toBe("o_auth_refresh")
    expect(deriveKind("HTMLToPDF")).toBe("html_to_pdf")
    expect(deriveKind("ProcessV2Import")).toBe("process_v2_import")
  })
})

describe("unique keys", () => {
  // The byte layout is a persistent format: these vectors must never change.
  it("match the frozen golden vectors", () => {
    const vectors: Array<[Parameters<typeof uniqueKey>[0], string]> = [
      [{ kind: "send_email" }, "bee8bfbcd9d48e51f79059a523039018"],
      [{ kind: "send_email", args: { to: "a@b.c", n: 1 } }, "d74775b9018c735a57b8407627706426"],
      [
        { kind: "send_email", queue: "mail", args: { n: 1, to: "a@b.c" } },
        "da42288b984c5d1acd1b6bf064543386"
      ],
      [{ kind: "report", periodBucket: 123456n }, "4a0c612c53886c59512e25051bf2e763"],
      [
        { kind: "report", queue: "q", args: [1, "two", null, { z: 0, a: -0 }], periodBucket: -1n },
        "e1c9e8572157c463f591384dd6486526"
      ],
      [{ kind: "ünïcødé", args: { "😀": "x", é: 1 } }, "34ef208c4f963b9dc66c9367a5e9e72d"]
    ]
    for (const [input, hex] of vectors) expect(toHex(uniqueKey(input))).toBe(hex)
  })

  it("does not depend on the order of object keys", () => {
    fc.assert(
      fc.property(fc.dictionary(fc.string(), fc.jsonValue()), (record) => {
        const reversed = Object.fromEntries(Object.entries(record).reverse())
        expect(toHex(uniqueKey({ kind: "k", args: reversed }))).toBe(
          toHex(uniqueKey({ kind: "k", args: record }))
        )
      })
    )
  })

  it("separates kind, queue and args so that shifting bytes between them changes the key", () => {
    expect(toHex(uniqueKey({ kind: "ab", queue: "c" }))).not.toBe(
      toHex(uniqueKey({ kind: "a", queue: "bc" }))
    )
  })
})

describe("canonical JSON", () => {
  it("sorts keys by UTF-8 bytes, prints -0 as 0 and drops undefined properties", () => {
    expect(canonicalJson({ b: 1, a: [-0, 1.5], c: undefined, "😀": 1, "\uffff": 2 })).toBe(
      '{"a":[0,1.5],"b":1,"\uffff":2,"😀":1}'
    )
    expect(compareUtf8("\uffff", "😀")).toBeLessThan(0) // UTF-16 order would say the opposite
  })

  it("rejects what jsonb cannot hold, naming the path", () => {
    expect(() => canonicalJson({ a: { b: [1, 10n] } })).toThrow("$.a.b[1]: bigint")
    expect(() => canonicalJson({ s: "a\u0000b" })).toThrow("NUL")
    expect(() => canonicalJson({ n: Number.POSITIVE_INFINITY })).toThrow("non-finite")
    const cyclic: Record<string, unknown> = {}
    cyclic.self = cyclic
    expect(() => canonicalJson(cyclic)).toThrow("circular")
    expect(() => canonicalJson(new Map())).toThrow("not plain JSON")
  })
})

describe("backoff", () => {
  it("is 2^attempt seconds plus up to 25 % jitter, capped at 24 h", () => {
    expect(backoffBounds(1)).toEqual({ min: 2000, max: 2500 })
    expect(backoffBounds(5)).toEqual({ min: 32_000, max: 40_000 })
    expect(backoffBounds(17)).toEqual({ min: 86_400_000, max: 86_400_000 })
    fc.assert(
      fc.property(
        fc.integer({ min: 0, max: 60 }),
        fc.double({ min: 0, max: 1, maxExcluded: true, noNaN: true }),
        (attempt, r) => {
          const { min, max } = backoffBounds(attempt)
          const ms = defaultBackoffMs(attempt, r)
          expect(ms).toBeGreaterThanOrEqual(min)
          expect(ms).toBeLessThanOrEqual(max)
        }
      )
    )
  })

  it("ages priorities one level per interval, never above priority 1", () => {
    expect(effectivePriority(4, 0, 60_000)).toBe(4)
    expect(effectivePriority(4, 60_000, 60_000)).toBe(3)
    expect(effectivePriority(4, 10 * 60_000, 60_000)).toBe(1)
    expect(effectivePriority(3, 10 * 60_000, 0)).toBe(3)
  })
})

describe("traceparent", () => {
  it("round-trips and rejects malformed or all-zero ids", () => {
    const ctx = { traceId: "4bf92f3577b34da6a3ce929d0e0e4736", spanId: "00f067aa0ba902b7", sampled: true }
    expect(Traceparent.decode(Traceparent.encode(ctx))).toEqual(ctx)
    expect(Traceparent.decode("00-00000000000000000000000000000000-00f067aa0ba902b7-01")).toBeUndefined()
    expect(Traceparent.decode("garbage")).toBeUndefined()
    expect(Traceparent.decode(42)).toBeUndefined()
  })
})

describe("checkNewJob", () => {
  it.effect("fills defaults and renders canonical JSON", () =>
    Effect.gen(function* () {
      const job = yield* checkNewJob({ kind: "k", args: { b: 1, a: 2 } }, { nowMillis: 0 })
      expect(job).toMatchObject({
        queue: "default",
        priority: 2,
        maxAttempts: 25,
        argsJson: '{"a":2,"b":1}',
        metadataJson: "{}"
      })
    })
  )

  it.effect("puts jobs of the same period in the same bucket and the next period in another", () =>
    Effect.gen(function* () {
      const at = (ms: number) =>
        checkNewJob({ kind: "k", args: {}, unique: { byPeriodMs: 60_000 } }, { nowMillis: ms })
      const a = yield* at(60_000)
      const b = yield* at(119_999)
      const c = yield* at(120_000)
      expect(toHex(a.uniqueKey!)).toBe(toHex(b.uniqueKey!))
      expect(toHex(a.uniqueKey!)).not.toBe(toHex(c.uniqueKey!))
    })
  )

  it.effect("rejects an oversized payload", () =>
    Effect.gen(function* () {
      const error = yield* Effect.flip(
        checkNewJob({ kind: "k", args: { s: "x".repeat(2048) } }, { nowMillis: 0, maxArgsBytes: 1024 })
      )
      expect(error.field).toBe("args")
      expect(error.reason).toMatch(/over the 1024-byte limit/)
    })
  )
})
