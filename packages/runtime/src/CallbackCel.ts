/**
 * CEL expressions of callbacks (capabilities.md §17) with `@bufbuild/cel`: `filter` and
 * `onComplete`/`onFail` (bool) and `transform` (any value), each over one variable, `payload`.
 *
 * - Checked at registration: an expression that does not parse is `InvalidCelExpression`.
 * - Evaluated at resolution (`decide`): an evaluation error (no such field, wrong type, a
 *   non-bool where a bool is needed) falls back to the default action, and is reported so the
 *   caller can log a warning — as the reference does.
 * - The payload is JSON: integers that JavaScript represents exactly become CEL `int` (so
 *   `payload.amount > 100` compares ints), other numbers `double`; objects are maps. A transform's
 *   result is converted back to JSON (ints to numbers, maps to objects).
 */
import { InvalidCelExpression } from "@awa/core"
import type { CallbackExpressions } from "@awa/storage"
import * as Cel from "@bufbuild/cel"
import { Effect } from "effect"

const fields = ["filter", "onComplete", "onFail", "transform"] as const

/** Fails with `InvalidCelExpression` naming the first expression that does not parse. */
export const check = (
  expressions: CallbackExpressions | undefined
): Effect.Effect<void, InvalidCelExpression> =>
  Effect.suspend(() => {
    for (const field of fields) {
      const expression = expressions?.[field]
      if (expression === undefined) continue
      if (typeof expression !== "string" || expression.trim() === "")
        return Effect.fail(
          new InvalidCelExpression({ field, expression: String(expression), reason: "empty" })
        )
      try {
        Cel.parse(expression)
      } catch (error) {
        return Effect.fail(
          new InvalidCelExpression({
            field,
            expression,
            reason: error instanceof Error ? error.message : String(error)
          })
        )
      }
    }
    return Effect.void
  })

/** JSON to a CEL input. */
const toCel = (value: unknown): Cel.CelInput => {
  if (value === null || value === undefined) return null
  if (typeof value === "number") return Number.isSafeInteger(value) ? BigInt(value) : value
  if (typeof value === "string" || typeof value === "boolean") return value
  if (Array.isArray(value)) return value.map(toCel) as Cel.CelInput
  if (typeof value === "object") {
    const map = new Map<string, Cel.CelInput>()
    for (const [k, v] of Object.entries(value)) map.set(k, toCel(v))
    return Cel.celMap(map)
  }
  return String(value)
}

/** A CEL value back to JSON. */
const toJson = (value: Cel.CelValue): unknown => {
  if (value === null || typeof value === "string" || typeof value === "boolean" || typeof value === "number")
    return value
  if (typeof value === "bigint") return Number(value)
  if (Cel.isCelUint(value)) return Number(value.value)
  if (Cel.isCelList(value)) return [...value].map(toJson)
  if (Cel.isCelMap(value)) {
    const out: Record<string, unknown> = {}
    for (const [k, v] of value) out[String(k)] = toJson(v)
    return out
  }
  if (value instanceof Uint8Array) return Buffer.from(value).toString("base64")
  return String(value)
}

type Evaluated =
  | { readonly ok: true; readonly value: Cel.CelValue }
  | { readonly ok: false; readonly error: string }

const evaluate = (expression: string, payload: unknown): Evaluated => {
  try {
    const value = Cel.run(expression, { payload: toCel(payload) })
    if (Cel.isCelError(value)) return { ok: false, error: value.message }
    return { ok: true, value }
  } catch (error) {
    return { ok: false, error: error instanceof Error ? error.message : String(error) }
  }
}

export type DefaultAction = "complete" | "fail" | "ignore"

export interface Decision {
  /** `ignore`: the filter rejected the payload (or the default said so); the callback stays pending. */
  readonly action: "complete" | "fail" | "ignore"
  /** The payload after `transform` (unchanged without one, or when it failed). */
  readonly payload: unknown
  /** Evaluation errors that made an expression fall back, for a warning. */
  readonly warnings: ReadonlyArray<string>
}

/**
 * What a resolution does with `payload`: `filter` false ⇒ ignore; then `onFail` true ⇒ fail,
 * `onComplete` true ⇒ complete, otherwise `defaultAction`; `transform` maps the payload.
 */
export const decide = (
  expressions: CallbackExpressions,
  payload: unknown,
  defaultAction: DefaultAction
): Decision => {
  const warnings: Array<string> = []
  const bool = (field: "filter" | "onComplete" | "onFail"): boolean | undefined => {
    const expression = expressions[field]
    if (expression === undefined) return undefined
    const r = evaluate(expression, payload)
    if (!r.ok) {
      warnings.push(`${field}: ${r.error}`)
      return undefined
    }
    if (typeof r.value !== "boolean") {
      warnings.push(`${field}: not a bool`)
      return undefined
    }
    return r.value
  }
  let out = payload
  if (expressions.transform !== undefined) {
    const r = evaluate(expressions.transform, payload)
    if (r.ok) out = toJson(r.value)
    else warnings.push(`transform: ${r.error}`)
  }
  // in order, each only when the ones before let it through; an evaluation error falls back to
  // the default action (not to a partial decision)
  const filter = bool("filter")
  if (filter === undefined && expressions.filter !== undefined)
    return { action: defaultAction, payload: out, warnings }
  if (filter === false) return { action: "ignore", payload: out, warnings }
  const onFail = bool("onFail")
  if (onFail === undefined && expressions.onFail !== undefined)
    return { action: defaultAction, payload: out, warnings }
  if (onFail === true) return { action: "fail", payload: out, warnings }
  const onComplete = bool("onComplete")
  if (onComplete === true) return { action: "complete", payload: out, warnings }
  return { action: defaultAction, payload: out, warnings }
}
