/**
 * Renders the installed schema from the catalogs as readable SQL: every table, partition layout,
 * index, sequence, view, type, trigger and function as it stands after all migrations, with who
 * may execute each function. `Schema.test.ts` compares it with the checked-in `schema.sql`, so a
 * reader finds the current definition of every object in one file instead of replaying the
 * migrations that redefined it.
 *
 * Only what the migrations decide is printed: the owner's role name is written `owner`, and
 * catalog details that differ between server majors (PostgreSQL 18's NOT NULL constraints in
 * `pg_constraint`) are left out, so the text is the same on every supported server.
 */
import { Effect } from "effect"
import { SqlClient } from "effect/sql"

interface Relation {
  readonly oid: number
  readonly name: string
  readonly kind: string
  readonly partkey: string | null
  readonly options: ReadonlyArray<string> | null
  readonly acl: string
}

const section = (title: string, blocks: ReadonlyArray<string>) =>
  blocks.length === 0 ? [] : [`-- ${"=".repeat(96)}\n-- ${title}\n-- ${"=".repeat(96)}`, ...blocks]

// Who besides the owner holds which privilege (the owner holds all, and their list differs
// between server majors), with PUBLIC named as such.
const aclText = (kind: "f" | "r") => `
  coalesce((
    SELECT string_agg(grantee || ': ' || privileges, '; ' ORDER BY grantee)
    FROM (
      SELECT CASE WHEN a.grantee = 0 THEN 'PUBLIC' ELSE pg_get_userbyid(a.grantee) END AS grantee,
             string_agg(a.privilege_type, ', ' ORDER BY a.privilege_type) AS privileges
      FROM aclexplode(coalesce(o.acl, acldefault('${kind}', o.owner))) a
      WHERE a.grantee <> o.owner
      GROUP BY 1
    ) g
  ), 'owner only')`

export const renderSchema = Effect.fn("renderSchema")(function* (schema: string) {
  const sql = yield* SqlClient.SqlClient
  const unsafe = <A extends object>(text: string) => sql.unsafe<A>(text, [schema])

  const relations = yield* unsafe<Relation>(`
    SELECT c.oid::int AS oid, c.relname AS name, c.relkind::text AS kind,
           CASE WHEN c.relkind = 'p' THEN pg_get_partkeydef(c.oid) END AS partkey,
           c.reloptions AS options,
           ${aclText("r").replaceAll("o.owner", "c.relowner").replaceAll("o.acl", "c.relacl")} AS acl
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname = $1 AND c.relkind IN ('r', 'p', 'v', 'm') AND NOT c.relispartition
    ORDER BY c.relname`)

  const tables: Array<string> = []
  const views: Array<string> = []
  for (const rel of relations) {
    if (rel.kind === "v" || rel.kind === "m") {
      const [view] = yield* sql<{ def: string }>`SELECT pg_get_viewdef(${rel.oid}::oid, true) AS def`
      views.push(
        `CREATE ${rel.kind === "m" ? "MATERIALIZED " : ""}VIEW ${schema}.${rel.name} AS\n${view?.def.trimEnd()}\n-- privileges besides the owner: ${rel.acl}`
      )
      continue
    }
    tables.push(yield* renderTable(schema, rel))
  }

  const indexes = yield* unsafe<{ def: string }>(`
    SELECT pg_get_indexdef(i.indexrelid) AS def
    FROM pg_index i
    JOIN pg_class t ON t.oid = i.indrelid
    JOIN pg_class x ON x.oid = i.indexrelid
    JOIN pg_namespace n ON n.oid = t.relnamespace
    WHERE n.nspname = $1 AND NOT t.relispartition
      AND NOT EXISTS (SELECT 1 FROM pg_constraint k WHERE k.conindid = i.indexrelid AND k.conrelid = t.oid)
    ORDER BY t.relname, x.relname`)

  const sequences = yield* unsafe<{ text: string }>(`
    SELECT format('CREATE SEQUENCE %s.%s AS %s START %s INCREMENT %s MINVALUE %s MAXVALUE %s CACHE %s%s',
                  n.nspname, c.relname, format_type(s.seqtypid, NULL), s.seqstart, s.seqincrement,
                  s.seqmin, s.seqmax, s.seqcache, CASE WHEN s.seqcycle THEN ' CYCLE' ELSE '' END) AS text
    FROM pg_sequence s JOIN pg_class c ON c.oid = s.seqrelid JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname = $1 ORDER BY c.relname`)

  const types = yield* unsafe<{ text: string }>(`
    SELECT CASE t.typtype
             WHEN 'e' THEN format('CREATE TYPE %s.%s AS ENUM (%s)', n.nspname, t.typname,
                    (SELECT string_agg(quote_literal(e.enumlabel), ', ' ORDER BY e.enumsortorder)
                     FROM pg_enum e WHERE e.enumtypid = t.oid))
             WHEN 'd' THEN format('CREATE DOMAIN %s.%s AS %s%s', n.nspname, t.typname,
                    format_type(t.typbasetype, t.typtypmod),
                    coalesce((SELECT ' ' || string_agg(pg_get_constraintdef(k.oid), ' ' ORDER BY k.conname)
                              FROM pg_constraint k WHERE k.contypid = t.oid), ''))
             ELSE format('CREATE TYPE %s.%s AS (%s)', n.nspname, t.typname,
                    (SELECT string_agg(a.attname || ' ' || format_type(a.atttypid, a.atttypmod), ', ' ORDER BY a.attnum)
                     FROM pg_attribute a WHERE a.attrelid = t.typrelid AND a.attnum > 0 AND NOT a.attisdropped))
           END AS text
    FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
    WHERE n.nspname = $1
      AND (t.typtype IN ('e', 'd')
           OR (t.typtype = 'c' AND (SELECT c.relkind FROM pg_class c WHERE c.oid = t.typrelid) = 'c'))
    ORDER BY t.typname`)

  const triggers = yield* unsafe<{ def: string }>(`
    SELECT pg_get_triggerdef(g.oid, true) AS def
    FROM pg_trigger g JOIN pg_class c ON c.oid = g.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace
    WHERE n.nspname = $1 AND NOT g.tgisinternal AND g.tgparentid = 0
    ORDER BY c.relname, g.tgname`)

  const functions = yield* unsafe<{ def: string; acl: string }>(`
    SELECT rtrim(pg_get_functiondef(p.oid), E'\\n') AS def,
           ${aclText("f").replaceAll("o.owner", "p.proowner").replaceAll("o.acl", "p.proacl")} AS acl
    FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
    WHERE n.nspname = $1 AND p.prokind IN ('f', 'p')
    ORDER BY p.proname, pg_get_function_identity_arguments(p.oid)`)

  return [
    ...section(
      "Types",
      types.map((t) => `${t.text};`)
    ),
    ...section(
      "Sequences",
      sequences.map((s) => `${s.text};`)
    ),
    ...section("Tables", tables),
    ...section(
      "Indexes (those not backing a constraint)",
      indexes.map((i) => `${i.def};`)
    ),
    ...section("Views", views),
    ...section(
      "Triggers",
      triggers.map((t) => `${t.def};`)
    ),
    ...section(
      "Functions (who may execute them, after each)",
      functions.map((f) => `${f.def}\n-- execute besides the owner: ${f.acl}`)
    )
  ].join("\n\n")
})

const renderTable = Effect.fnUntraced(function* (schema: string, rel: Relation) {
  const sql = yield* SqlClient.SqlClient
  const columns = yield* sql<{ line: string }>`
    SELECT format('%I %s%s%s%s', a.attname, format_type(a.atttypid, a.atttypmod),
                  CASE a.attidentity WHEN 'a' THEN ' GENERATED ALWAYS AS IDENTITY'
                                     WHEN 'd' THEN ' GENERATED BY DEFAULT AS IDENTITY' ELSE '' END,
                  CASE WHEN a.attgenerated = 's' THEN ' GENERATED ALWAYS AS (' || pg_get_expr(d.adbin, d.adrelid) || ') STORED'
                       WHEN d.adbin IS NOT NULL THEN ' DEFAULT ' || pg_get_expr(d.adbin, d.adrelid) ELSE '' END,
                  CASE WHEN a.attnotnull THEN ' NOT NULL' ELSE '' END) AS line
    FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
    WHERE a.attrelid = ${rel.oid}::oid AND a.attnum > 0 AND NOT a.attisdropped
    ORDER BY a.attnum`
  const constraints = yield* sql<{ line: string }>`
    SELECT format('CONSTRAINT %I %s', conname, pg_get_constraintdef(oid)) AS line
    FROM pg_constraint WHERE conrelid = ${rel.oid}::oid AND contype <> 'n' ORDER BY conname`
  const children = yield* sql<{ name: string; bound: string; options: ReadonlyArray<string> | null }>`
    SELECT c.relname AS name, pg_get_expr(c.relpartbound, c.oid) AS bound, c.reloptions AS options
    FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
    WHERE i.inhparent = ${rel.oid}::oid
    ORDER BY length(c.relname), c.relname`
  const body = [...columns.map((c) => c.line), ...constraints.map((c) => c.line)].map((l) => `  ${l}`)
  const lines = [`CREATE TABLE ${schema}.${rel.name} (\n${body.join(",\n")}\n)`]
  if (rel.partkey !== null) lines.push(`PARTITION BY ${rel.partkey}`)
  if (rel.options !== null) lines.push(`WITH (${rel.options.join(", ")})`)
  const text = [`${lines.join("\n")};`]
  if (children.length > 0) text.push(describePartitions(rel.name, children))
  text.push(`-- privileges besides the owner: ${rel.acl}`)
  return text.join("\n")
})

// Ring tables have one child per slot, `<table>_<k>` FOR VALUES IN (k): say so in one line, and
// list the children one by one only when they depart from that shape.
const describePartitions = (
  parent: string,
  children: ReadonlyArray<{ name: string; bound: string; options: ReadonlyArray<string> | null }>
) => {
  const regular = children.every(
    (c, k) => c.name === `${parent}_${k}` && c.bound === `FOR VALUES IN (${k})` && c.options === null
  )
  if (regular) {
    return `-- partitions: ${parent}_0 … ${parent}_${children.length - 1}, one per slot (FOR VALUES IN (k))`
  }
  return children
    .map(
      (c) => `-- partition ${c.name} ${c.bound}${c.options === null ? "" : ` WITH (${c.options.join(", ")})`}`
    )
    .join("\n")
}
