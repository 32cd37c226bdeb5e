/**
 * Helpers for SQL kept as reviewed text. The Postgres driver speaks the extended query protocol,
 * which runs one statement per call, so migration files are split into statements here. The
 * splitter understands exactly what our migration files use: `--` and nested `/* *\/` comments,
 * single-quoted strings (with `''` escapes), double-quoted identifiers and dollar quoting
 * (`$$ … $$`, `$tag$ … $tag$`), which is where PL/pgSQL bodies hide their semicolons.
 */

const dollarTag = /^\$([A-Za-z_][A-Za-z0-9_]*)?\$/

/** Splits SQL text into statements at top-level semicolons, dropping empty ones and comments-only ones. */
export const splitStatements = (text: string): Array<string> => {
  const statements: Array<string> = []
  let start = 0
  let i = 0
  let meaningful = false
  const n = text.length
  const push = (end: number) => {
    const statement = text.slice(start, end).trim()
    if (meaningful && statement.length > 0) statements.push(statement)
    meaningful = false
  }
  while (i < n) {
    const c = text[i]!
    const next = text[i + 1]
    if (c === "-" && next === "-") {
      const eol = text.indexOf("\n", i)
      i = eol === -1 ? n : eol + 1
    } else if (c === "/" && next === "*") {
      let depth = 1
      i += 2
      while (i < n && depth > 0) {
        if (text[i] === "/" && text[i + 1] === "*") {
          depth++
          i += 2
        } else if (text[i] === "*" && text[i + 1] === "/") {
          depth--
          i += 2
        } else i++
      }
    } else if (c === "'" || c === '"') {
      meaningful = true
      i++
      while (i < n) {
        if (text[i] === c) {
          if (text[i + 1] === c) i += 2
          else break
        } else i++
      }
      i++
    } else if (c === "$" && dollarTag.test(text.slice(i, i + 64))) {
      meaningful = true
      const tag = dollarTag.exec(text.slice(i, i + 64))![0]
      const close = text.indexOf(tag, i + tag.length)
      if (close === -1) throw new Error(`unterminated dollar quote ${tag}`)
      i = close + tag.length
    } else if (c === ";") {
      push(i)
      i++
      start = i
    } else {
      if (!/\s/.test(c)) meaningful = true
      i++
    }
  }
  push(n)
  return statements
}

const identifier = /^[a-z_][a-z0-9_]{0,49}$/

/** True when `name` can be used unquoted as a Postgres schema name (lower case, ≤ 50 bytes, so derived channel names fit 63). */
export const isValidSchemaName = (name: string): boolean => identifier.test(name)
