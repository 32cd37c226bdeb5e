/**
 * The `awa` command line against Postgres (issue 18): every command's output and exit code, run
 * in process through `Cli.run` (what `bin/awa.ts` runs) with stdout and stderr captured. Each
 * test uses its own queue names on one database; migrate and doctor get empty databases.
 */
import { CronStorage, QueueStorage } from "@awa/storage"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Fiber } from "effect"
import { SqlClient } from "effect/sql"
import { awa, cronDeclaration, fresh, httpGet, json, until, withDatabase } from "./support.ts"

describe("awa CLI", () => {
  it.live("--help lists every command and exits 0; an unknown command or a missing database exits 1", () =>
    Effect.gen(function* () {
      const help = yield* awa("postgres://unused", "--help")
      assert.strictEqual(help.code, 0)
      for (const command of ["migrate", "status", "queues", "queue", "jobs", "dlq", "cron", "doctor"])
        assert.include(help.out, `\n  ${command} `)
      const unknown = yield* awa("postgres://unused", "frobnicate")
      assert.strictEqual(unknown.code, 1)
      const noDatabase = yield* awa("", "queues")
      assert.deepStrictEqual(
        [noDatabase.code, noDatabase.err],
        [1, "no database: pass --database-url or set DATABASE_URL"]
      )
    })
  )

  it.live(
    "migrate --dry-run lists pending migrations (exit 2), migrate applies them, then nothing is pending (exit 0)",
    () =>
      withDatabase(
        (url) =>
          Effect.gen(function* () {
            const dry = yield* awa(url, "migrate", "--dry-run")
            assert.strictEqual(dry.code, 2)
            assert.match(dry.out, /^\d+ migration\(s\) would run:\nversion {2}name/)
            assert.include(dry.out, "1        control")
            const dryJson = json(yield* awa(url, "--json", "migrate", "--dry-run"))
            const pending = dryJson.pending as ReadonlyArray<{ version: number }>
            const ran = yield* awa(url, "migrate")
            assert.strictEqual(ran.code, 0)
            assert.strictEqual(
              ran.out,
              `schema "awa": applied ${pending.length} migration(s), version 0 -> ${pending.at(-1)!.version}`
            )
            const again = yield* awa(url, "migrate", "--dry-run")
            assert.deepStrictEqual([again.code, again.out], [0, "schema up to date: nothing to run"])
          }),
        false
      )
  )

  it.live("doctor reports each check with its fix; a schema not installed fails it (exit 2)", () =>
    withDatabase(
      (url) =>
        Effect.gen(function* () {
          const before = yield* awa(url, "doctor")
          assert.strictEqual(before.code, 2)
          assert.include(before.out, 'FAIL  schema: schema "awa" not installed\n      fix: run: awa migrate')
          yield* awa(url, "migrate")
          const after = yield* awa(url, "--json", "doctor")
          const checks = json(after).checks as ReadonlyArray<{ name: string; status: string }>
          assert.deepStrictEqual(
            checks.map((c) => c.name),
            [
              "server version",
              "schema",
              "jit",
              "default isolation",
              "lock budget",
              "privileges",
              "long transactions",
              "wake-ups on demand"
            ]
          )
          assert.strictEqual(checks.find((c) => c.name === "schema")!.status, "pass")
          // exit 0 only when every check passes (JIT depends on the server build)
          assert.strictEqual(after.code, checks.every((c) => c.status === "pass") ? 0 : 2)
        }),
      false
    )
  )

  it.live("status shows schema version, leader, both rings and table sizes", () =>
    withDatabase((url) =>
      Effect.gen(function* () {
        const ran = yield* awa(url, "status")
        assert.strictEqual(ran.code, 0)
        assert.match(ran.out, /^schema {10}awa\nschema version {2}(\d+) \(this code: \1\)\nleader {10}none\n/)
        assert.match(ran.out, /\nqueue {4}0 +0 +- +- +never/)
        assert.match(ran.out, /\nhistory {2}0 +0 /)
        assert.include(ran.out, "\ndeferred ")
        const report = json(yield* awa(url, "--json", "status"))
        assert.deepStrictEqual(
          (report.rings as ReadonlyArray<{ ring: string }>).map((r) => r.ring),
          ["queue", "history"]
        )
      })
    )
  )

  it.live("queues prints per-queue statistics; --exact adds stored counts; a bad window exits 1", () =>
    withDatabase((url) =>
      Effect.gen(function* () {
        const storage = yield* QueueStorage
        const q = fresh("cli-queues")
        yield* storage.enqueueMany([
          { kind: "k", queue: q, args: {} },
          { kind: "k", queue: q, args: {} }
        ])
        const [c] = yield* storage.claim({ queue: q, max: 1, deadlineMs: 0, agingIntervalMs: 0 })
        yield* storage.finalizeMany([
          { jobId: c!.jobId, runLease: c!.runLease, outcome: { _tag: "Complete" } }
        ])
        yield* storage.pauseQueue(q)
        const ran = yield* awa(url, "queues")
        assert.strictEqual(ran.code, 0)
        assert.match(
          ran.out,
          /^queue +paused +available +running +scheduled +retryable +dlq +oldest +done\/300s +failed\/300s +completed total +enq\/min +done\/min +fail\/min\n/
        )
        assert.match(ran.out, new RegExp(`\\n${q} +yes +1 +0 +0 +0 +0 +\\d+s +1 +0 +1 +- +- +-\\n`))
        const report = json(yield* awa(url, "--json", "queues", "--exact"))
        const mine = (report.queues as ReadonlyArray<any>).find((x) => x.queue === q)
        assert.deepStrictEqual([mine.available, mine.stored], [1, { completed: 1, failed: 0, cancelled: 0 }])
        const bad = yield* awa(url, "queues", "--window", "0")
        assert.strictEqual(bad.code, 1)
        assert.include(bad.err, "ValidationError")
      })
    )
  )

  it.live("wake-on-demand shows the setting, sets it, and refuses anything but on and off", () =>
    withDatabase((url) =>
      Effect.gen(function* () {
        const storage = yield* QueueStorage
        // a new install starts with it on (migration 0051)
        assert.deepStrictEqual(yield* awa(url, "wake-on-demand"), {
          code: 0,
          out: "wake-ups on demand: on",
          err: ""
        })
        assert.deepStrictEqual(json(yield* awa(url, "--json", "wake-on-demand", "off")), {
          wakeOnDemand: false
        })
        assert.isFalse(yield* storage.wakeOnDemand)
        assert.strictEqual((yield* awa(url, "wake-on-demand", "on")).out, "wake-ups on demand: on")
        assert.isTrue(yield* storage.wakeOnDemand)
        const bad = yield* awa(url, "wake-on-demand", "maybe")
        assert.strictEqual(bad.code, 1)
        assert.isTrue(yield* storage.wakeOnDemand, "a refused call changes nothing")
      })
    )
  )

  it.live("queue pause, resume and drain", () =>
    withDatabase((url) =>
      Effect.gen(function* () {
        const storage = yield* QueueStorage
        const q = fresh("cli-queue")
        yield* storage.enqueueMany([1, 2, 3].map((n) => ({ kind: "k", queue: q, args: { n } })))
        assert.deepStrictEqual(yield* awa(url, "queue", "pause", q), {
          code: 0,
          out: `queue ${q} paused`,
          err: ""
        })
        assert.isTrue((yield* storage.queueStats()).queues.find((x) => x.queue === q)!.paused)
        assert.strictEqual((yield* awa(url, "queue", "resume", q)).out, `queue ${q} resumed`)
        assert.isFalse((yield* storage.queueStats()).queues.find((x) => x.queue === q)!.paused)
        const drained = yield* awa(url, "queue", "drain", q)
        assert.deepStrictEqual([drained.code, drained.out], [0, `queue ${q}: 3 job(s) cancelled`])
        assert.include(drained.err, "batches of 500")
        assert.deepStrictEqual(json(yield* awa(url, "--json", "queue", "drain", q)), {
          queue: q,
          cancelled: 0
        })
      })
    )
  )

  it.live("queue shards sets the width every producer reads; out of range is a ValidationError", () =>
    withDatabase((url) =>
      Effect.gen(function* () {
        const storage = yield* QueueStorage
        const sql = yield* SqlClient.SqlClient
        const q = fresh("cli-shards")
        assert.deepStrictEqual(yield* awa(url, "queue", "shards", q, "4"), {
          code: 0,
          out: `queue ${q}: 4 shard(s) per priority`,
          err: ""
        })
        for (let n = 0; n < 4; n++) yield* storage.enqueueMany([{ kind: "k", queue: q, args: { n } }])
        const [lanes] = yield* sql<{ n: number }>`SELECT count(*)::int AS n FROM awa.lanes WHERE queue = ${q}`
        assert.strictEqual(lanes!.n, 4)
        const bad = yield* awa(url, "queue", "shards", q, "65")
        assert.strictEqual(bad.code, 1)
        assert.include(bad.err, "ValidationError")
        assert.deepStrictEqual(json(yield* awa(url, "--json", "queue", "shards", q, "1")), {
          queue: q,
          enqueueShards: 1
        })
      })
    )
  )

  it.live("bulk actions report progress per committed batch of 500 on stderr", () =>
    withDatabase((url) =>
      Effect.gen(function* () {
        const storage = yield* QueueStorage
        const q = fresh("cli-progress")
        yield* storage.enqueueMany(
          Array.from({ length: 1200 }, (_, n) => ({ kind: "k", queue: q, args: { n } }))
        )
        const drained = yield* awa(url, "queue", "drain", q)
        assert.strictEqual(drained.code, 0)
        assert.deepStrictEqual(drained.err.split("\n").slice(1), [
          "  [########------------] 500/1200",
          "  [#################---] 1000/1200",
          "  [####################] 1200/1200"
        ])
        assert.strictEqual(drained.out, `queue ${q}: 1200 job(s) cancelled`)
        // --json prints no progress
        const quiet = yield* awa(url, "--json", "queue", "drain", q)
        assert.strictEqual(quiet.err, "")
      })
    )
  )

  it.live("jobs list (filters), show, cancel and retry; an unknown or malformed id exits 1", () =>
    withDatabase((url) =>
      Effect.gen(function* () {
        const storage = yield* QueueStorage
        const q = fresh("cli-jobs")
        const [a, b] = yield* storage.enqueueMany([
          { kind: "email", queue: q, args: { to: "a" } },
          { kind: "sms", queue: q, args: { to: "b" } }
        ])
        const listed = json(yield* awa(url, "--json", "jobs", "list", "--queue", q, "--kind", "email"))
        assert.deepStrictEqual(
          (listed.jobs as ReadonlyArray<{ id: string }>).map((j) => j.id),
          [a!.id.toString()]
        )
        const table = yield* awa(url, "jobs", "list", "--queue", q)
        assert.match(table.out, new RegExp(`\\n${b!.id} +available +${q} +sms +2 +0/25 `))
        const shown = yield* awa(url, "jobs", "show", a!.id.toString())
        assert.strictEqual(shown.code, 0)
        assert.match(shown.out, /\nkind +email\n/)
        assert.match(shown.out, /\nargs +\{"to":"a"\}\n/)
        const cancelled = yield* awa(url, "jobs", "cancel", a!.id.toString(), "--reason", "not needed")
        assert.deepStrictEqual([cancelled.code, cancelled.out], [0, `job ${a!.id} is cancelled`])
        const retried = yield* awa(url, "jobs", "retry", a!.id.toString())
        assert.deepStrictEqual([retried.code, retried.out], [0, `job ${a!.id} is available again`])
        const missing = yield* awa(url, "jobs", "show", "999999999")
        assert.deepStrictEqual([missing.code, missing.err], [1, "JobNotFound: job 999999999 not found"])
        const malformed = yield* awa(url, "jobs", "show", "abc")
        assert.deepStrictEqual([malformed.code, malformed.err], [1, "not a job id: abc"])
        const badState = yield* awa(url, "jobs", "list", "--state", "sleeping")
        assert.strictEqual(badState.code, 1)
      })
    )
  )

  it.live("dlq list, show, retry one, purge by filter; a bulk action without filter needs --all", () =>
    withDatabase((url) =>
      Effect.gen(function* () {
        const storage = yield* QueueStorage
        const q = fresh("cli-dlq")
        yield* storage.configureQueue(q, { dlq: true })
        yield* storage.enqueueMany(
          [1, 2, 3].map((n) => ({ kind: "k", queue: q, args: { n }, maxAttempts: 1 }))
        )
        const claimed = yield* storage.claim({ queue: q, max: 3, deadlineMs: 0, agingIntervalMs: 0 })
        yield* storage.finalizeMany(
          claimed.map((c) => ({
            jobId: c.jobId,
            runLease: c.runLease,
            outcome: { _tag: "Fail" as const, error: "boom" }
          }))
        )
        const [first, second] = claimed.map((c) => c.jobId)
        const listed = yield* awa(url, "dlq", "list", "--queue", q)
        assert.strictEqual(listed.code, 0)
        assert.match(listed.out, new RegExp(`\\n${first} +${q} +k +terminal_error +1/1 +\\S+ +boom`))
        const shown = yield* awa(url, "dlq", "show", first!.toString())
        assert.match(shown.out, /\nreason +terminal_error(\n|$)/)
        const retried = yield* awa(url, "dlq", "retry", first!.toString())
        assert.deepStrictEqual([retried.code, retried.out], [0, `job ${first} retried: available`])
        const unsafe = yield* awa(url, "dlq", "purge")
        assert.strictEqual(unsafe.code, 1)
        assert.include(unsafe.err, "UnsafeBulkFilter")
        const purged = yield* awa(url, "--json", "dlq", "purge", "--queue", q)
        assert.deepStrictEqual(json(purged), { purged: 2 })
        const gone = yield* awa(url, "dlq", "show", second!.toString())
        assert.strictEqual(gone.code, 1)
      })
    )
  )

  it.live("cron list, pause, resume and trigger; an unknown schedule exits 1", () =>
    withDatabase((url) =>
      Effect.gen(function* () {
        const cron = yield* CronStorage.CronStorage
        const name = fresh("cli-cron")
        const q = fresh("cli-cron-q")
        yield* cron.upsert([cronDeclaration(name, q)])
        const listed = yield* awa(url, "cron", "list")
        assert.match(listed.out, new RegExp(`\\n${name} +0 3 \\* \\* \\* +UTC +${q} +nightly +no +- +no`))
        assert.strictEqual((yield* awa(url, "cron", "pause", name)).out, `schedule ${name} paused`)
        const paused = json(yield* awa(url, "--json", "cron", "list"))
        assert.isTrue((paused.schedules as ReadonlyArray<any>).find((s) => s.name === name).paused)
        assert.strictEqual((yield* awa(url, "cron", "resume", name)).out, `schedule ${name} resumed`)
        const triggered = yield* awa(url, "cron", "trigger", name)
        assert.strictEqual(triggered.code, 0)
        assert.match(triggered.out, new RegExp(`^schedule ${name} enqueued job \\d+ \\(available\\)$`))
        const missing = yield* awa(url, "cron", "pause", "no-such-schedule")
        assert.strictEqual(missing.code, 1)
        assert.include(missing.err, "CronNotFound")
      })
    )
  )

  it.live(
    "serve runs the admin API and the dashboard until interrupted; a public bind without a token is refused (exit 1)",
    () =>
      withDatabase((url) =>
        Effect.gen(function* () {
          const refused = yield* awa(url, "serve", "--host", "0.0.0.0")
          assert.deepStrictEqual(
            [refused.code, refused.err],
            [1, "binding 0.0.0.0 needs an admin token (--token or AWA_ADMIN_TOKEN) or --insecure-no-auth"]
          )
          const port = 40_000 + Math.floor(Math.random() * 20_000)
          const fiber = yield* Effect.forkChild(
            awa(url, "serve", "--port", String(port), "--token", "t0k", "--shutdown-grace", "0")
          )
          const get = httpGet(`http://127.0.0.1:${port}`)
          // wait for the listener (a condition, not a time)
          const health = yield* until(get, "/healthz", (r) => r.status === 200)
          assert.deepStrictEqual(JSON.parse(health.body), { status: "ok", database: "reachable" })
          assert.strictEqual((yield* get("/api/queues/x/pause", { method: "POST" })).status, 401)
          const paused = yield* get("/api/queues/x/pause", {
            method: "POST",
            headers: { authorization: "Bearer t0k" }
          })
          assert.deepStrictEqual(
            [paused.status, JSON.parse(paused.body)],
            [200, { queue: "x", paused: true }]
          )
          // the dashboard is served beside the API
          const page = yield* get("/dashboard")
          assert.strictEqual(page.status, 200)
          assert.include(page.body, "app.js")
          yield* Fiber.interrupt(fiber)
          assert.strictEqual((yield* get("/healthz")).status, 0)
        })
      )
  )
})
