/**
 * Canonical JSON (capabilities.md §4): object keys sorted by UTF-8 byte order, no whitespace,
 * numbers as ECMAScript prints them with `-0` as `0`, `undefined` properties omitted. Non-finite
 * numbers, `bigint`, functions, symbols, cycles and NUL characters (jsonb cannot store them) are
 * rejected. The same walk validates that a value can be stored as jsonb.
 */

export class JsonError extends Error {
  readonly path: string
  constructor(path: string, reason: string) {
    super(`${path}: ${reason}`)
    this.path = path
  }
}

const utf8 = new TextEncoder()

/**
 * Compares strings by their UTF-8 bytes (JavaScript's default sort uses UTF-16 code units).
 * UTF-8 byte order is code point order, and so is UTF-16 code unit order as long as neither unit
 * at the first difference is a surrogate or above (≥ U+D800): then the answer comes without
 * encoding. Otherwise both strings are encoded and compared byte by byte.
 */
export const compareUtf8 = (a: string, b: string): number => {
  const n = Math.min(a.length, b.length)
  for (let i = 0; i < n; i++) {
    const x = a.charCodeAt(i)
    const y = b.charCodeAt(i)
    if (x !== y) return x < 0xd800 && y < 0xd800 ? x - y : compareEncoded(a, b)
  }
  return a.length - b.length
}

const compareEncoded = (a: string, b: string): number => {
  const x = utf8.encode(a)
  const y = utf8.encode(b)
  const n = Math.min(x.length, y.length)
  for (let i = 0; i < n; i++) if (x[i] !== y[i]) return x[i]! - y[i]!
  return x.length - y.length
}

const checkString = (s: string, path: () => string) => {
  if (s.includes("\u0000"))
    throw new JsonError(path(), "contains a NUL character, which Postgres jsonb cannot store")
}

// Paths are built only for an error message: the walk is on every enqueue's hot path.
const member = (path: string, key: string | number) =>
  typeof key === "number" ? `${path}[${key}]` : `${path}.${key}`

const walk = (value: unknown, path: string, seen: Set<object>): string => {
  if (typeof value === "object" && value !== null) return walkObject(value, path, seen)
  return scalar(value, path, undefined)
}

const scalar = (value: unknown, parent: string, key: string | number | undefined): string => {
  switch (typeof value) {
    case "string":
      checkString(value, () => (key === undefined ? parent : member(parent, key)))
      return JSON.stringify(value)
    case "number":
      if (!Number.isFinite(value))
        throw new JsonError(key === undefined ? parent : member(parent, key), `non-finite number ${value}`)
      // as JSON.stringify for finite numbers, and -0 prints as 0
      return String(value)
    case "boolean":
      return value ? "true" : "false"
    case "bigint":
      throw new JsonError(
        key === undefined ? parent : member(parent, key),
        "bigint is not JSON; encode it as a string in the Schema"
      )
    case "object":
      return "null"
  }
  throw new JsonError(key === undefined ? parent : member(parent, key), `${typeof value} is not JSON`)
}

const item = (value: unknown, path: string, key: string | number, seen: Set<object>): string =>
  typeof value === "object" && value !== null
    ? walkObject(value, member(path, key), seen)
    : scalar(value, path, key)

const walkObject = (object: object, path: string, seen: Set<object>): string => {
  if (seen.has(object)) throw new JsonError(path, "circular reference")
  seen.add(object)
  try {
    if (Array.isArray(object)) {
      let out = "["
      for (let i = 0; i < object.length; i++) {
        if (i > 0) out += ","
        const v = object[i]
        out += v === undefined ? "null" : item(v, path, i, seen)
      }
      return `${out}]`
    }
    if (typeof (object as { toJSON?: unknown }).toJSON === "function") {
      return walk((object as { toJSON: () => unknown }).toJSON(), path, seen)
    }
    const proto = Object.getPrototypeOf(object)
    if (proto !== Object.prototype && proto !== null) {
      throw new JsonError(path, `${proto?.constructor?.name ?? "object"} instance is not plain JSON`)
    }
    const keys = Object.keys(object)
    // usually already in order (objects built from one literal or Schema): sort only if not
    for (let i = 1; i < keys.length; i++) {
      if (compareUtf8(keys[i - 1]!, keys[i]!) > 0) {
        keys.sort(compareUtf8)
        break
      }
    }
    let out = "{"
    for (const k of keys) {
      const v = (object as Record<string, unknown>)[k]
      if (v === undefined) continue
      checkString(k, () => member(path, k))
      if (out.length > 1) out += ","
      out += `${JSON.stringify(k)}:${item(v, path, k, seen)}`
    }
    return `${out}}`
  } finally {
    seen.delete(object)
  }
}

/** Canonical JSON text of `value`; throws `JsonError` naming the offending path. */
export const canonicalJson = (value: unknown, root = "$"): string => walk(value, root, new Set())
