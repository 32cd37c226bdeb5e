/**
 * The dashboard in a real browser (issue 19): Debian's chromium driven by playwright-core against
 * the admin server (AdminApi + Dashboard layers) over a database seeded with jobs in every state.
 * Every page is opened, every action performed and its effect seen in the page and in the
 * database; an action without the token is refused; read-only mode hides actions. Screenshots of
 * every page at desktop and narrow width go to docs/screenshots/.
 *
 * One browser for the file and one server per mode. Waits are on selectors and text, never time.
 * Without /usr/bin/chromium the file is skipped outside CI (run .ci/install-chromium); in CI
 * (`CI` or `AWA_REQUIRE_BROWSER` set; .ci/run sets the latter) it fails instead.
 */
import { existsSync, mkdirSync } from "node:fs"
import { createServer } from "node:http"
import { fileURLToPath } from "node:url"
import { Admin } from "@awa/runtime"
import { CronStorage, LeaderLock, PgQueueStorage, QueueStorage } from "@awa/storage"
import { TestDatabase } from "@awa/testing"
import { NodeHttpServer } from "@effect/platform-node"
import { PgClient } from "@effect/sql-pg"
import { Context, Effect, Exit, Layer, Redacted, Scope } from "effect"
import { HttpRouter, HttpServer } from "effect/http"
import { type Browser, chromium, type Page } from "playwright-core"
import { afterAll, assert, beforeAll, describe, it } from "vitest"
import * as AdminApi from "../src/AdminApi.ts"
import * as Dashboard from "../src/Dashboard.ts"
import { cronDeclaration } from "./support.ts"

const chromiumPath = "/usr/bin/chromium"
const hasChromium = existsSync(chromiumPath)
// in CI (CI set, or AWA_REQUIRE_BROWSER as .ci/run sets) a missing chromium fails the tests
const required = process.env.CI !== undefined || process.env.AWA_REQUIRE_BROWSER !== undefined
if (!hasChromium && !required)
  console.warn(`Dashboard browser tests skipped: ${chromiumPath} is missing (run .ci/install-chromium)`)
const runBrowser = hasChromium || required

const token = "dash-s3cret"
const screenshots = fileURLToPath(new URL("../../../docs/screenshots/", import.meta.url))
const traceId = "4bf92f3577b34da6a3ce929d0e0e4736"

type Services = QueueStorage | CronStorage.CronStorage | HttpServer.HttpServer

/** The admin API and the dashboard on an ephemeral port over a fresh database, the leader's lock held. */
const serverLayer = (options: AdminApi.AdminApiOptions) =>
  Layer.unwrap(
    Effect.map(TestDatabase.acquire(), ({ url }) => {
      const storage = Layer.mergeAll(
        PgQueueStorage.layer(),
        CronStorage.layerPg(),
        LeaderLock.layerPg()
      ).pipe(Layer.provideMerge(PgClient.layer({ url: Redacted.make(url), maxConnections: 4 })))
      const leader = Layer.effectDiscard(Effect.flatMap(LeaderLock.LeaderLock, (lock) => lock.tryAcquire))
      const app = Layer.mergeAll(
        AdminApi.layer(options),
        Dashboard.layer({
          ...options,
          pollIntervalMs: 1000,
          traceLinkTemplate: "https://traces.example/trace/{traceId}"
        })
      )
      return HttpRouter.serve(app, { disableListenLog: true, disableLogger: true }).pipe(
        Layer.provideMerge(NodeHttpServer.layer(createServer, { port: 0, host: "127.0.0.1" })),
        Layer.provideMerge(Layer.merge(Admin.layer(), leader).pipe(Layer.provideMerge(storage)))
      )
    })
  )

/** A running server: its base URL, a runner for effects against its storage, and its scope. */
const start = async (options: AdminApi.AdminApiOptions) => {
  const scope = Effect.runSync(Scope.make())
  const context = (await Effect.runPromise(
    Layer.buildWithScope(serverLayer(options), scope)
  )) as Context.Context<Services>
  const base = HttpServer.formatAddress(Context.get(context, HttpServer.HttpServer).address)
  const run = <A, E>(effect: Effect.Effect<A, E, Services>) =>
    Effect.runPromise(Effect.provide(effect, context))
  return { base, run, close: () => Effect.runPromise(Scope.close(scope, Exit.void)) }
}

type Server = Awaited<ReturnType<typeof start>>

const reportSchedule = (name: string, queue: string) =>
  cronDeclaration(name, queue, {
    expression: "30 2 * * *",
    timezone: "Europe/Paris",
    kind: "report",
    args: { period: "daily" }
  })

/**
 * Jobs in every state: `orders` holds available (one with a trace id and tags) and scheduled
 * jobs, `work` completed, retryable, cancelled, failed and running ones, `mail` (dead-lettering)
 * three dead letters, `bulk` 60 available jobs (more than a page); one cron schedule.
 */
const seed = Effect.gen(function* () {
  const storage = yield* QueueStorage
  const cron = yield* CronStorage.CronStorage
  yield* storage.configureQueue("mail", { dlq: true })
  const [traced] = yield* storage.enqueueMany([
    {
      kind: "charge",
      queue: "orders",
      args: { order: 1042, amount: "19.90" },
      tags: ["vip", "eu"],
      unique: { byQueue: true },
      metadata: { "awa:traceparent": `00-${traceId}-00f067aa0ba902b7-01` }
    },
    { kind: "charge", queue: "orders", args: { order: 1043 } },
    { kind: "invoice", queue: "orders", args: { order: 1041 }, runAt: new Date(Date.now() + 3_600_000) }
  ])
  const work = yield* storage.enqueueMany(
    [1, 2, 3, 4, 5].map((n) => ({ kind: "resize", queue: "work", args: { n }, maxAttempts: 3 }))
  )
  const claimed = yield* storage.claim({ queue: "work", max: 5, deadlineMs: 0, agingIntervalMs: 0 })
  const token = (n: number) => {
    const c = claimed.find((x) => x.jobId === work[n]!.id)!
    return { jobId: c.jobId, runLease: c.runLease }
  }
  yield* storage.finalizeMany([
    { ...token(0), outcome: { _tag: "Complete" } },
    {
      ...token(1),
      outcome: { _tag: "Retry", delayMs: 3_600_000, error: "timeout talking to the image service" }
    },
    { ...token(2), outcome: { _tag: "Cancel", reason: "superseded" } },
    { ...token(3), outcome: { _tag: "Fail", error: "unsupported format" } }
  ])
  const dead = yield* storage.enqueueMany(
    [1, 2, 3].map((n) => ({
      kind: "send",
      queue: "mail",
      args: { to: `user${n}@example.com` },
      maxAttempts: 1
    }))
  )
  const mail = yield* storage.claim({ queue: "mail", max: 3, deadlineMs: 0, agingIntervalMs: 0 })
  yield* storage.finalizeMany(
    mail.map((c) => ({
      jobId: c.jobId,
      runLease: c.runLease,
      outcome: { _tag: "Fail" as const, error: "550 mailbox unavailable" }
    }))
  )
  yield* storage.enqueueMany(
    Array.from({ length: 60 }, (_, n) => ({ kind: "noop", queue: "bulk", args: { n } }))
  )
  yield* cron.upsert([reportSchedule("nightly-report", "orders")])
  return {
    traced: traced!.id.toString(),
    dead: dead.map((d) => d.id.toString()),
    running: token(4),
    completed: work[0]!.id.toString()
  }
})

const withStorage = <A, E>(f: (storage: QueueStorage["Service"]) => Effect.Effect<A, E>) =>
  Effect.gen(function* () {
    return yield* f(yield* QueueStorage)
  })

const stats = (queue: string) =>
  Effect.map(
    withStorage((s) => s.queueStats()),
    (r) => r.queues.find((q) => q.queue === queue)
  )

const shoot = async (page: Page, name: string) => {
  mkdirSync(screenshots, { recursive: true })
  await page.setViewportSize({ width: 1280, height: 800 })
  await page.screenshot({ path: `${screenshots}${name}-desktop.png`, fullPage: true })
  await page.setViewportSize({ width: 390, height: 844 })
  await page.screenshot({ path: `${screenshots}${name}-narrow.png`, fullPage: true })
  await page.setViewportSize({ width: 1280, height: 800 })
}

/** Navigates to a hash route and waits for that page's content. */
const open = async (page: Page, server: Server, hash: string, ready: string) => {
  await page.goto(`${server.base}/dashboard${hash}`)
  await page.locator(`main[data-route="${hash}"] ${ready}`).first().waitFor()
}

/**
 * A computed style of the element `selector` finds, found and read in one task of the page: the
 * dashboard redraws its view every poll, and an element a locator found just before a redraw is
 * detached by the time it is read (its computed style is then empty).
 */
const computedStyle = (page: Page, selector: string, property: string, pseudo?: string) =>
  page.evaluate(
    ([selector, property, pseudo]) => {
      const element = document.querySelector(selector!)
      return element === null ? null : getComputedStyle(element, pseudo).getPropertyValue(property!)
    },
    [selector, property, pseudo] as const
  )

const noticeSays = async (page: Page, text: string) => {
  try {
    await page.locator("#notice", { hasText: text }).waitFor({ timeout: 15_000 })
  } catch (error) {
    throw new Error(
      `notice never said ${JSON.stringify(text)}; it says ${JSON.stringify(await page.locator("#notice").innerText())}`,
      { cause: error }
    )
  }
}

describe.skipIf(!runBrowser)("dashboard", () => {
  // one browser for the file
  let browser: Browser
  beforeAll(async () => {
    browser = await chromium.launch({ executablePath: chromiumPath, headless: true, args: ["--no-sandbox"] })
  })
  afterAll(async () => {
    await browser?.close()
  })

  describe("in chromium", () => {
    let server: Server
    let page: Page
    let seeded: Effect.Success<typeof seed>

    beforeAll(async () => {
      server = await start({ token: Redacted.make(token) })
      seeded = await server.run(seed)
      page = await browser.newPage({ viewport: { width: 1280, height: 800 } })
      page.on("dialog", (dialog) => void dialog.accept())
    })
    afterAll(async () => {
      await server?.close()
    })

    it("every page opens with the seeded data; screenshots at desktop and narrow width", async () => {
      await open(page, server, "#/", 'tr[data-queue="work"]')
      const work = page.locator('tr[data-queue="work"] td')
      // available, running, scheduled, retryable, dead
      assert.deepStrictEqual(
        (await work.allInnerTexts()).slice(1, 6).map((x) => x.trim()),
        ["0", "1", "0", "1", "0"]
      )
      assert.include(await page.locator("main").innerText(), "version")
      await page.locator("text=pid").waitFor()
      // a job finishing while the page is open moves the count; the leader's samples (taken here
      // by hand) draw the last hour's sparklines from the server's history
      const sample = withStorage((s) => s.sampleQueueStats({ minIntervalMs: 0, keepMs: 7_200_000 }))
      await server.run(sample)
      await server.run(
        withStorage((s) => s.finalizeMany([{ ...seeded.running, outcome: { _tag: "Complete" } }]))
      )
      await server.run(sample)
      await server.run(
        withStorage((s) => s.recordPruneState("queue", { outcome: "blocked", reason: "lock" }))
      )
      await page.locator('tr[data-queue="work"] td:nth-child(9)', { hasText: "2" }).waitFor()
      await page.locator('tr[data-queue="work"] svg.spark polyline.done').waitFor({ state: "attached" })
      await page.locator('[data-prune="queue"]', { hasText: "blocked (lock)" }).waitFor()
      await shoot(page, "overview")

      await open(page, server, "#/queue/orders", "tr[data-job]")
      assert.strictEqual(await page.locator("tr[data-job]").count(), 3)
      await shoot(page, "queue")

      await open(page, server, `#/job/${seeded.traced}`, "#job-state")
      const job = await page.locator("main").innerText()
      assert.include(job, '"order": 1042')
      assert.include(job, "vip, eu")
      assert.strictEqual(
        await page.locator(`a[href="https://traces.example/trace/${traceId}"]`).count(),
        1,
        "trace link from the template"
      )
      assert.match(
        await page.locator("dt:has-text('Unique key') + dd").innerText(),
        /^[0-9a-f]{32}$/,
        "the unique key, hex"
      )
      await shoot(page, "job")
      // every attempt with its duration
      await open(page, server, `#/job/${seeded.completed}`, 'tr[data-attempt="1"]')
      assert.match(await page.locator('tr[data-attempt="1"]').innerText(), /completed\s+\d+ ms/)

      await open(page, server, "#/dlq", "tr[data-dlq]")
      assert.strictEqual(await page.locator("tr[data-dlq]").count(), 3)
      await shoot(page, "dlq")
      await open(page, server, `#/dlq/${seeded.dead[0]}`, "pre")
      assert.include(await page.locator("main").innerText(), "550 mailbox unavailable")
      await shoot(page, "dlq-entry")

      await open(page, server, "#/cron", 'tr[data-cron="nightly-report"]')
      // the next fire, 02:30 in Paris, shown in the schedule's own zone
      assert.match(
        await page.locator('tr[data-cron="nightly-report"]').innerText(),
        /2:30:00\sAM\sGMT\+1|02:30:00/
      )
      await shoot(page, "cron")
    })

    it("queue page: filters and keyset pagination are in the URL", async () => {
      await open(page, server, "#/queue/work", "tr[data-job]")
      await page.selectOption('select[name="state"]', "retryable")
      await page.click("#filters button[type=submit]")
      await page.locator('main[data-route="#/queue/work?state=retryable"] tr[data-job]').first().waitFor()
      assert.deepStrictEqual(await page.locator("tr[data-job] td:nth-child(3)").allInnerTexts(), [
        "retryable"
      ])

      await open(page, server, "#/queue/bulk", "#next-page")
      assert.strictEqual(await page.locator("tr[data-job]").count(), 50)
      await page.click("#next-page")
      await page.locator('main[data-route*="before="] tr[data-job]').first().waitFor()
      assert.strictEqual(await page.locator("tr[data-job]").count(), 10)
    })

    it("queue page: a filter chosen but not applied survives the poll's redraw, focused or not", async () => {
      await open(page, server, "#/queue/work", "tr[data-job]")
      await page.selectOption('select[name="state"]', "retryable")
      // focus leaves the form (a click elsewhere before Filter): only the pending edit holds the redraw
      await page.evaluate(() => (document.activeElement as HTMLElement | null)?.blur())
      const polls = Number(await page.locator("#view").getAttribute("data-polls"))
      // two polls later: at least one whole poll ran after the blur
      await page.waitForFunction(
        (n) => Number(document.getElementById("view")?.dataset.polls) >= n + 2,
        polls
      )
      assert.strictEqual(await page.locator('select[name="state"]').inputValue(), "retryable")
      await page.click("#filters button[type=submit]")
      await page.locator('main[data-route="#/queue/work?state=retryable"] tr[data-job]').first().waitFor()
      // applied: the polls redraw again
      const after = Number(await page.locator("#view").getAttribute("data-polls"))
      const before = await page.locator("#updated").innerText()
      await page.waitForFunction(
        ([n, text]) =>
          Number(document.getElementById("view")?.dataset.polls) >= (n as number) + 2 &&
          document.getElementById("updated")?.textContent !== text,
        [after, before] as const
      )
    })

    it("queue page: the time filter (created or finalized, after/before) is in the URL", async () => {
      await open(page, server, "#/queue/orders", "tr[data-job]")
      await page.fill('input[name="after"]', "2999-01-01T00:00")
      await page.click("#filters button[type=submit]")
      await page
        .locator('main[data-route*="after=2999-01-01T00%3A00"] p.muted', { hasText: "No jobs match." })
        .waitFor()
      await open(page, server, "#/queue/orders?time=created&after=2000-01-01T00%3A00", "tr[data-job]")
      assert.strictEqual(await page.locator("tr[data-job]").count(), 3)
      await open(page, server, "#/queue/work?time=finalized&after=2000-01-01T00%3A00", "tr[data-job]")
      assert.sameMembers(await page.locator("tr[data-job] td:nth-child(3)").allInnerTexts(), [
        "completed",
        "completed",
        "cancelled",
        "failed"
      ])
    })

    it("overview at 390 px: the queue table folds into cards, no sideways scrolling", async () => {
      await page.setViewportSize({ width: 390, height: 844 })
      try {
        await open(page, server, "#/", 'tr[data-queue="work"]')
        const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth)
        assert.isAtMost(overflow, 0, "page wider than the window")
        // one card per queue: the header row is hidden, each cell carries its label
        assert.strictEqual(await computedStyle(page, ".cards thead", "display"), "none")
        assert.strictEqual(
          await computedStyle(
            page,
            'tr[data-queue="work"] td[data-label="Available"]',
            "content",
            "::before"
          ),
          '"Available"'
        )
      } finally {
        await page.setViewportSize({ width: 1280, height: 800 })
      }
    })

    it("an action without the token is refused and changes nothing", async () => {
      await page.evaluate(() => sessionStorage.clear())
      await open(page, server, "#/queue/orders", 'button[data-act="pause"]')
      await page.click('button[data-act="pause"]')
      await noticeSays(page, "refused: the admin token is missing or wrong")
      assert.isFalse((await server.run(stats("orders")))!.paused)
    })

    it("with the token: pause, resume and drain a queue", async () => {
      await page.fill("#token", token)
      await page.press("#token", "Enter")
      await noticeSays(page, "token kept")
      await open(page, server, "#/queue/orders", 'button[data-act="pause"]')
      await page.click('button[data-act="pause"]')
      await noticeSays(page, "paused orders")
      await page.locator(".badge.paused").waitFor()
      assert.isTrue((await server.run(stats("orders")))!.paused)
      await page.click('button[data-act="resume"]')
      await noticeSays(page, "resumed orders")
      assert.isFalse((await server.run(stats("orders")))!.paused)

      await open(page, server, "#/queue/bulk", 'button[data-act="drain"]')
      await page.click('button[data-act="drain"]')
      await noticeSays(page, "drained bulk: 60 jobs cancelled")
      assert.strictEqual((await server.run(stats("bulk")))?.available ?? 0, 0)
    })

    it("keyboard: the focused button keeps focus across the poll's redraw, and Enter acts", async () => {
      await open(page, server, "#/queue/orders", 'button[data-act="pause"]')
      await page.focus('button[data-act="pause"]')
      const before = await page.locator("#updated").innerText()
      // a redraw has happened once the footer's time changes
      await page.waitForFunction((text) => document.getElementById("updated")?.textContent !== text, before)
      assert.strictEqual(await page.evaluate(() => document.activeElement?.getAttribute("data-act")), "pause")
      await page.keyboard.press("Enter")
      await noticeSays(page, "paused orders")
      assert.isTrue((await server.run(stats("orders")))!.paused)
      await page.focus('button[data-act="resume"]')
      await page.keyboard.press("Enter")
      await noticeSays(page, "resumed orders")
      assert.isFalse((await server.run(stats("orders")))!.paused)
    })

    it("job page: cancel then retry", async () => {
      await open(page, server, `#/job/${seeded.traced}`, 'button[data-act="cancel"]')
      await page.click('button[data-act="cancel"]')
      await page.locator("#job-state", { hasText: "cancelled" }).waitFor()
      const id = BigInt(seeded.traced)
      assert.strictEqual((await server.run(withStorage((s) => s.getJob(id)))).state, "cancelled")
      await page.click('button[data-act="retry"]')
      await page.locator("#job-state", { hasText: "available" }).waitFor()
      assert.strictEqual((await server.run(withStorage((s) => s.getJob(id)))).state, "available")
    })

    it("dead letters: retry one, purge the rest selected, with progress", async () => {
      const dlq = () => server.run(withStorage((s) => s.listDlq({ queue: "mail" })))
      await open(
        page,
        server,
        "#/dlq?queue=mail",
        `tr[data-dlq="${seeded.dead[0]}"] button[data-act="dlq-retry"]`
      )
      await page.click(`tr[data-dlq="${seeded.dead[0]}"] button[data-act="dlq-retry"]`)
      await noticeSays(page, `job ${seeded.dead[0]} is back: available`)
      assert.deepStrictEqual(
        (await dlq()).map((e) => e.id.toString()).sort(),
        [seeded.dead[1]!, seeded.dead[2]!].sort()
      )
      await page.locator(`tr[data-dlq="${seeded.dead[0]}"]`).waitFor({ state: "detached" })
      for (const id of [seeded.dead[1], seeded.dead[2]]) await page.check(`input.pick[value="${id}"]`)
      await page.click('button[data-bulk="purge"]')
      await noticeSays(page, "purged 2 of 2 dead letters")
      assert.deepStrictEqual(await dlq(), [])
    })

    it("dead letters: keyset pages of 50 over the API, 'Older' in the URL", async () => {
      await server.run(
        withStorage((s) =>
          Effect.gen(function* () {
            yield* s.configureQueue("bounce", { dlq: true })
            yield* s.enqueueMany(
              Array.from({ length: 52 }, (_, n) => ({
                kind: "send",
                queue: "bounce",
                args: { n },
                maxAttempts: 1
              }))
            )
            const claimed = yield* s.claim({ queue: "bounce", max: 52, deadlineMs: 0, agingIntervalMs: 0 })
            yield* s.finalizeMany(
              claimed.map((c) => ({
                jobId: c.jobId,
                runLease: c.runLease,
                outcome: { _tag: "Fail" as const, error: "bounced" }
              }))
            )
          })
        )
      )
      await open(page, server, "#/dlq?queue=bounce", "#dlq-next")
      assert.strictEqual(await page.locator("tr[data-dlq]").count(), 50)
      await page.click("#dlq-next")
      await page.locator('main[data-route*="before="] tr[data-dlq]').first().waitFor()
      assert.strictEqual(await page.locator("tr[data-dlq]").count(), 2)
    })

    it("cron: pause, resume, trigger now", async () => {
      const schedule = () =>
        server.run(
          Effect.map(
            Effect.gen(function* () {
              return yield* (yield* CronStorage.CronStorage).list
            }),
            (s) => s.schedules.find((x) => x.name === "nightly-report")!
          )
        )
      await open(page, server, "#/cron", 'button[data-act="cron-pause"]')
      await page.click('button[data-act="cron-pause"]')
      await noticeSays(page, "paused nightly-report")
      assert.isTrue((await schedule()).paused)
      await page.click('button[data-act="cron-resume"]')
      await noticeSays(page, "resumed nightly-report")
      assert.isFalse((await schedule()).paused)
      const before = (await server.run(stats("orders")))!.available
      await page.click('button[data-act="cron-trigger"]')
      await noticeSays(page, "triggered: job")
      assert.strictEqual((await server.run(stats("orders")))!.available, before + 1)
    })
  })

  describe("in read-only mode", () => {
    let server: Server

    beforeAll(async () => {
      server = await start({ token: Redacted.make(token), readOnly: true })
      await server.run(seed)
    })
    afterAll(async () => {
      await server?.close()
    })

    it("shows the data and hides every action and the token field", async () => {
      const page = await browser.newPage()
      await open(page, server, "#/queue/orders", "tr[data-job]")
      await page.locator("#mode", { hasText: "read-only" }).waitFor()
      assert.strictEqual(await page.locator("main button[data-act]").count(), 0)
      assert.isTrue(await page.locator("#token").isHidden())
      await open(page, server, "#/dlq", "tr[data-dlq]")
      assert.strictEqual(await page.locator("button[data-act], button[data-bulk], input.pick").count(), 0)
      await open(page, server, "#/cron", "tr[data-cron]")
      assert.strictEqual(await page.locator("button[data-act]").count(), 0)
    })
  })
})
