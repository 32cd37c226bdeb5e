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

/** Compares strings by their UTF-8 bytes (JavaScript's default sort uses UTF-16 code units). */
export const compareUtf8 = (a: string, b: string): number => {
  const x = utf8.encode(a)
  const y = utf8.encode(b)
  const n = Math.min(x.length, y.length)
  for (let i = 0; i < n; i++) if (x[i] !== y[i]) return x[i]! - y[i]!
  return x.length - y.length
}

const checkString = (s: string, path: string) => {
  if (s.includes("\u0000"))
    throw new JsonError(path, "contains a NUL character, which Postgres jsonb cannot store")
}

const walk = (value: unknown, path: string, seen: Set<object>): string => {
  switch (typeof value) {
    case "string":
      checkString(value, path)
      return JSON.stringify(value)
    case "number":
      if (!Number.isFinite(value)) throw new JsonError(path, `non-finite number ${value}`)
      return Object.is(value, -0) ? "0" : JSON.stringify(value)
    case "boolean":
      return value ? "true" : "false"
    case "bigint":
      throw new JsonError(path, "bigint is not JSON; encode it as a string in the Schema")
    case "undefined":
    case "function":
    case "symbol":
      throw new JsonError(path, `${typeof value} is not JSON`)
  }
  if (value === null) return "null"
  const object = value as object
  if (seen.has(object)) throw new JsonError(path, "circular reference")
  seen.add(object)
  try {
    if (Array.isArray(object)) {
      return `[${object.map((item, i) => (item === undefined ? "null" : walk(item, `${path}[${i}]`, seen))).join(",")}]`
    }
    if (typeof (object as { toJSON?: unknown }).toJSON === "function") {
      return walk((object as { toJSON: () => unknown }).toJSON(), path, seen)
    }
    const proto = Object.getPrototypeOf(object)
    if (proto !== Object.prototype && proto !== null) {
      throw new JsonError(path, `${proto?.constructor?.name ?? "object"} instance is not plain JSON`)
    }
    const entries = Object.entries(object).filter(([, v]) => v !== undefined)
    entries.sort(([a], [b]) => compareUtf8(a, b))
    return `{${entries
      .map(([k, v]) => {
        checkString(k, `${path}.${k}`)
        return `${JSON.stringify(k)}:${walk(v, `${path}.${k}`, seen)}`
      })
      .join(",")}}`
  } finally {
    seen.delete(object)
  }
}

/** Canonical JSON text of `value`; throws `JsonError` naming the offending path. */
export const canonicalJson = (value: unknown, root = "$"): string => walk(value, root, new Set())
