/**
 * SQL files of a prototype, run over an installed schema: the benchmark tools' way to price
 * another build of a function through the whole stack (`keyedClaimSideBySide.ts --sql`,
 * `AWA_BENCH_SQL` in systems/awa.ts). One statement per file: the driver prepares what it sends,
 * and a prepared statement holds one command. `:AWA_SCHEMA` is read as `awa`, as in migrations.
 */
import { readFileSync } from "node:fs"
import { Effect } from "effect"
import { SqlClient } from "effect/sql"

export const runSqlFiles = (files: ReadonlyArray<string>) =>
  Effect.flatMap(SqlClient.SqlClient, (sql) =>
    Effect.forEach(
      files,
      (file) => sql.unsafe(readFileSync(file, "utf8").replaceAll(":AWA_SCHEMA", "awa")).unprepared,
      { discard: true }
    )
  )
