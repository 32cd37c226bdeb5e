import { describe, expect, it } from "@effect/vitest"
import { Effect } from "effect"
import fc from "fast-check"
import { ValidationError } from "../src/AwaError.ts"
import { backoffBounds, defaultBackoffMs, effectivePriority } from "../src/Backoff.ts"
import { canonicalJson, compareUtf8 } from "../src/CanonicalJson.ts"
import { deriveKind } from "../src/Job.ts"
import { CheckMemo, checkNewJob, checkNewJobSync } from "../src/NewJob.ts"
import * as Traceparent from "../src/Traceparent.ts"
import { toHex, uniqueKey } from "../src/UniqueKey.ts"

/** The byte comparison by definition: encode both and compare bytes (the fast path must agree). */
const compareEncodedUtf8 = (a: string, b: string) => {
  const x = new TextEncoder().encode(a)
  const y = new TextEncoder().encode(b)
  for (let i = 0; i < Math.min(x.length, y.length); i++) if (x[i] !== y[i]) return x[i]! - y[i]!
  return x.length - y.length
}

/** Canonical JSON by its definition, written for clarity (the walk in CanonicalJson.ts is tuned). */
const referenceCanonical = (value: unknown): string => {
  if (value === null) return "null"
  if (typeof value === "number") return JSON.stringify(Object.is(value, -0) ? 0 : value)
  if (typeof value !== "object") return JSON.stringify(value)
  if (Array.isArray(value))
    return `[${value.map((v) => (v === undefined ? "null" : referenceCanonical(v))).join(",")}]`
  const entries = Object.entries(value as Record<string, unknown>).filter(([, v]) => v !== undefined)
  entries.sort(([a], [b]) => compareEncodedUtf8(a, b))
  return `{${entries.map(([k, v]) => `${JSON.stringify(k)}:${referenceCanonical(v)}`).join(",")}}`
}

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

  it("compares strings exactly as their UTF-8 bytes compare, surrogates and U+E000–U+FFFF included", () => {
    const text = fc.string({
      unit: fc.oneof(
        fc.constantFrom("a", "\ud7ff", "\ue000", "\uffff"),
        fc.string({ unit: "binary", minLength: 1, maxLength: 1 })
      )
    })
    fc.assert(
      fc.property(text, text, (a, b) => {
        expect(Math.sign(compareUtf8(a, b))).toBe(Math.sign(compareEncodedUtf8(a, b)))
        expect(Math.sign(compareUtf8(a + b, a))).toBe(Math.sign(compareEncodedUtf8(a + b, a)))
      }),
      { numRuns: 2000 }
    )
  })

  it("renders any JSON value as the reference definition does", () => {
    const key = fc
      .string({
        unit: fc.oneof(
          fc.constantFrom("a", "b", "\uffff", "é"),
          fc.string({ unit: "binary", minLength: 1, maxLength: 1 })
        )
      })
      .filter((k) => !k.includes("\u0000") && k !== "__proto__")
    const value = fc.letrec((tie) => ({
      json: fc.oneof(
        { depthSize: "small" },
        fc.constantFrom(null, true, false, -0, 0, 1e21, 1.5, -3),
        fc.double({ noNaN: true, noDefaultInfinity: true }),
        fc.string({ unit: "binary" }).filter((s) => !s.includes("\u0000")),
        fc.array(tie("json")),
        fc.dictionary(key, fc.oneof(tie("json"), fc.constant(undefined)))
      )
    })).json
    fc.assert(
      fc.property(value, (v) => {
        expect(canonicalJson(v)).toBe(referenceCanonical(v))
      }),
      { numRuns: 1000 }
    )
  })

  it("rejects what jsonb cannot hold, naming the path", () => {
    expect(() => canonicalJson({ a: { b: [1, 10n] } })).toThrow("$.a.b[1]: bigint")
    expect(() => canonicalJson({ s: "a\u0000b" })).toThrow("NUL")
    expect(() => canonicalJson({ n: Number.POSITIVE_INFINITY })).toThrow("non-finite")
    const cyclic: Record<string, unknown> = {}
    cyclic.self = cyclic
    expect(() => canonicalJson(cyclic)).toThrow("circular")
    expect(() => canonicalJson(new Map())).toThrow("not plain JSON")
    expect(() => canonicalJson([{ a: [{ "k\u0000": 1 }] }])).toThrow("$[0].a[0].k\u0000: contains a NUL")
    expect(() => canonicalJson({ f: () => 1 })).toThrow("$.f: function is not JSON")
    expect(() => canonicalJson(undefined)).toThrow("$: undefined is not JSON")
    expect(() => canonicalJson([1, [Number.NaN]])).toThrow("$[1][0]: non-finite number NaN")
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

  it("checks each job of a batch on its own, objects shared between jobs only once", () => {
    const memo = new CheckMemo()
    const shared = { team: "a" }
    const tags = ["t"]
    const check = (job: Parameters<typeof checkNewJobSync>[0]) => checkNewJobSync(job, { nowMillis: 0 }, memo)
    const a = check({ kind: "k", args: { n: 1 }, metadata: shared, tags })
    const b = check({ kind: "k", args: { n: 2 }, metadata: shared, tags })
    const c = check({ kind: "k", args: { n: 3 }, metadata: { team: "b" }, tags: ["u"] })
    const d = check({ kind: "k", args: { n: 4 }, metadata: { "awa:x": 1 } })
    const e = check({ kind: "k", args: { n: 5 }, tags: ["x".repeat(101)] })
    for (const job of [a, b, c]) expect(job).not.toBeInstanceOf(ValidationError)
    expect((a as { metadataJson: string }).metadataJson).toBe('{"team":"a"}')
    expect((b as { metadataJson: string }).metadataJson).toBe('{"team":"a"}')
    expect((c as { metadataJson: string }).metadataJson).toBe('{"team":"b"}')
    expect((c as { tags: ReadonlyArray<string> }).tags).toEqual(["u"])
    expect((d as ValidationError).field).toBe("metadata.awa:x")
    expect((e as ValidationError).field).toBe("tags[0]")
  })

  it("hashes the rendered args to the same unique key as the args themselves", () => {
    fc.assert(
      fc.property(fc.jsonValue(), (args) => {
        const checked = checkNewJobSync({ kind: "k", args, unique: {} }, { nowMillis: 0 })
        if (checked instanceof ValidationError) return
        expect(toHex(checked.uniqueKey!)).toBe(toHex(uniqueKey({ kind: "k", args })))
      })
    )
  })

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
