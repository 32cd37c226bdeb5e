/**
 * One line that names an error's real cause. Driver errors nest it: `SqlError: PgConnection:
 * Failed to connect` → `ConnectionError` → `Error: database "x" does not exist`; a harness error
 * must show the last of these on its first line, not the first.
 */
export const causeLine = (error: unknown): string => {
  const messages: Array<string> = []
  const seen = new Set<unknown>()
  for (let e: unknown = error; e !== undefined && e !== null && !seen.has(e); ) {
    seen.add(e)
    const message = (e instanceof Error ? e.message : typeof e === "object" ? "" : String(e))
      .split("\n")[0]!
      .trim()
    if (message !== "" && !messages.some((m) => m.includes(message))) messages.push(message)
    e = typeof e === "object" ? (e as { cause?: unknown }).cause : undefined
  }
  return messages.length === 0 ? String(error) : messages.join(": ")
}

/** `url` without its password, for messages. */
export const redactUrl = (url: string): string => {
  try {
    const parsed = new URL(url)
    if (parsed.password !== "") parsed.password = "***"
    return parsed.toString()
  } catch {
    return "(unparsable URL)"
  }
}
