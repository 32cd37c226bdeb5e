/** Callback signatures (capabilities.md §18): the golden vector, rejections, strict mode. */
import { describe, expect, it } from "vitest"
import { AwaConfigError } from "../src/AwaError.ts"
import * as CallbackSignature from "../src/CallbackSignature.ts"

const key = CallbackSignature.keyFromHex("07".repeat(32)) as CallbackSignature.SigningKey
const other = CallbackSignature.keyFromHex("08".repeat(32)) as CallbackSignature.SigningKey

describe("callback signatures", () => {
  it("golden vector: key of 32 bytes 0x07, id `abc`", () => {
    expect(CallbackSignature.sign(key, "abc")).toBe(
      "b1495225f01fa8cd09e410d288d09b68c1cc9fb2414686c0d3ac13fc905497d9"
    )
    expect(CallbackSignature.verify(key, "abc", CallbackSignature.sign(key, "abc"))).toBeUndefined()
  })

  it("rejects a wrong secret, a wrong id, malformed, upper-case and empty signatures", () => {
    const good = CallbackSignature.sign(key, "abc")
    expect(CallbackSignature.verify(key, "abc", CallbackSignature.sign(other, "abc"))?.reason).toBe(
      "mismatch"
    )
    expect(CallbackSignature.verify(key, "abd", good)?.reason).toBe("mismatch")
    expect(CallbackSignature.verify(key, "abc", good.slice(0, 63))?.reason).toBe("malformed")
    expect(CallbackSignature.verify(key, "abc", `${good}00`)?.reason).toBe("malformed")
    expect(CallbackSignature.verify(key, "abc", good.toUpperCase())?.reason).toBe("malformed")
    expect(CallbackSignature.verify(key, "abc", "zz".repeat(32))?.reason).toBe("malformed")
    expect(CallbackSignature.verify(key, "abc", "")?.reason).toBe("missing")
    expect(CallbackSignature.verify(key, "abc", undefined)?.reason).toBe("missing")
  })

  it("secrets must be 64 hex characters", () => {
    for (const bad of ["", "07".repeat(31), "07".repeat(33), "zz".repeat(32)])
      expect(CallbackSignature.keyFromHex(bad)).toBeInstanceOf(AwaConfigError)
  })

  it("strict mode binds id, action, body and a timestamp within ±300 s", () => {
    const now = 1_800_000_000
    const body = '{"payload":{"ok":true}}'
    const signature = CallbackSignature.signStrict(key, "abc", "complete", body, now)
    const request = { callbackId: "abc", action: "complete", body, signature, timestamp: String(now) }
    expect(CallbackSignature.verifyStrict(key, request, now + 299)).toBeUndefined()
    expect(CallbackSignature.verifyStrict(key, request, now + 301)?.reason).toMatch(/timestamp/)
    expect(CallbackSignature.verifyStrict(key, { ...request, action: "fail" }, now)?.reason).toBe("mismatch")
    expect(
      CallbackSignature.verifyStrict(key, { ...request, body: '{"payload":{"ok":false}}' }, now)?.reason
    ).toBe("mismatch")
    expect(CallbackSignature.verifyStrict(key, { ...request, callbackId: "abd" }, now)?.reason).toBe(
      "mismatch"
    )
    expect(CallbackSignature.verifyStrict(key, { ...request, timestamp: undefined }, now)?.reason).toMatch(
      /timestamp/
    )
    // the id-only signature is not a strict one
    expect(
      CallbackSignature.verifyStrict(key, { ...request, signature: CallbackSignature.sign(key, "abc") }, now)
        ?.reason
    ).toBe("mismatch")
  })
})
