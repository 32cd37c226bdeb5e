import { describe, expect, it } from "vitest"
import { splitStatements } from "../src/SqlText.ts"

describe("splitStatements", () => {
  it("splits at top-level semicolons and drops comment-only pieces", () => {
    expect(splitStatements("SELECT 1; -- c;\n SELECT 2;\n/* a; /* nested; */ b; */")).toEqual([
      "SELECT 1",
      "-- c;\n SELECT 2"
    ])
  })

  it("keeps semicolons inside strings, identifiers and dollar quotes", () => {
    const fn =
      "CREATE FUNCTION f() RETURNS int LANGUAGE plpgsql AS $body$ BEGIN PERFORM 1; RETURN 2; END $body$"
    const text = `SELECT 'a;''b'; SELECT "x;y" FROM t; ${fn}; DO $$ BEGIN NULL; END $$;`
    expect(splitStatements(text)).toEqual([
      `SELECT 'a;''b'`,
      `SELECT "x;y" FROM t`,
      fn,
      "DO $$ BEGIN NULL; END $$"
    ])
  })

  it("does not mistake positional parameters for dollar quotes", () => {
    expect(splitStatements("SELECT $1; SELECT $2")).toEqual(["SELECT $1", "SELECT $2"])
  })

  it("rejects an unterminated dollar quote", () => {
    expect(() => splitStatements("DO $$ BEGIN")).toThrow(/unterminated/)
  })
})
