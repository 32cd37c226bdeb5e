/**
 * Cron without storage: declaration checks, tick computation (against a plain forward walk) and
 * what croner 10 does on daylight-saving days, pinned so an upgrade that changes it fails here
 * (docs/cron.md documents these tables).
 */
import { AwaConfigError, Job } from "@awa/core"
import { assert, describe, it } from "@effect/vitest"
import { Effect, Schema } from "effect"
import * as Cron from "../src/Cron.ts"

const Report = Job.define({ kind: "report", args: Schema.Struct({ n: Schema.Number }), queue: "cron" })

const parsed = (expression: string, timezone = "UTC") => {
  const p = Cron.parse(expression, timezone)
  if (p._tag === "Invalid") throw new Error(p.reason)
  return p.cron
}

const at = (iso: string) => Date.parse(iso)
const iso = (millis: number) => new Date(millis).toISOString()

/** Local wall-clock time of an instant in `timezone` with its UTC offset, e.g. "03:30:00 GMT-04:00". */
const local = (millis: number, timezone: string) =>
  new Intl.DateTimeFormat("en-GB", {
    timeZone: timezone,
    hour: "2-digit",
    minute: "2-digit",
    second: "2-digit",
    hourCycle: "h23",
    timeZoneName: "longOffset"
  }).format(new Date(millis))

/** Every tick in (from, to], by stepping `nextTick`. */
const walk = (expression: string, timezone: string, from: string, to: string) => {
  const cron = parsed(expression, timezone)
  const out: Array<number> = []
  for (let t = Cron.nextTick(cron, at(from)); t !== undefined && t <= at(to); t = Cron.nextTick(cron, t))
    out.push(t)
  return out
}

describe("Cron declarations", () => {
  const valid = Cron.schedule({ name: "ok", cron: "*/15 * * * * *", job: Report, args: { n: 1 } })

  it.effect("a valid schedule resolves to its stored declaration, with the definition's defaults", () =>
    Effect.gen(function* () {
      const [d] = yield* Cron.check([
        valid,
        Cron.schedule({
          name: "nightly",
          cron: "30 2 * * *",
          timezone: "Europe/Berlin",
          job: Report,
          args: { n: 2 },
          options: { priority: 1, tags: ["nightly"] },
          missedFire: { catchUp: { max: 7 } }
        })
      ]).pipe(Effect.map((ds) => ds.slice(1)))
      assert.deepStrictEqual(d, {
        name: "nightly",
        expression: "30 2 * * *",
        timezone: "Europe/Berlin",
        job: {
          kind: "report",
          queue: "cron",
          args: { n: 2 },
          priority: 1,
          maxAttempts: 25,
          tags: ["nightly"],
          metadata: {}
        },
        missedFire: { _tag: "CatchUp", max: 7 }
      })
      const [coalesce] = yield* Cron.check([valid])
      assert.deepStrictEqual([coalesce!.timezone, coalesce!.missedFire], ["UTC", { _tag: "Coalesce" }])
      const [defaultMax] = yield* Cron.check([{ ...valid, name: "d", missedFire: { catchUp: {} } }])
      assert.deepStrictEqual(defaultMax!.missedFire, { _tag: "CatchUp", max: Cron.defaultCatchUpMax })
      // nicknames are 5-field shorthands
      assert.strictEqual((yield* Cron.check([{ ...valid, cron: "@daily" }]))[0]!.expression, "@daily")
    })
  )

  it.effect("every invalid declaration is reported at once, by name and field", () =>
    Effect.gen(function* () {
      const bad = (fields: Partial<Cron.CronSchedule>): Cron.CronSchedule => ({ ...valid, ...fields })
      const error = yield* Effect.flip(
        Cron.check([
          valid,
          bad({ name: "minute61", cron: "61 * * * *" }),
          bad({ name: "seven", cron: "0 0 0 * * * 2027" }),
          bad({ name: "four", cron: "* * * *" }),
          bad({ name: "once", cron: "2027-01-01T00:00:00" }),
          bad({ name: "colon", cron: "0:30 * * * *" }),
          bad({ name: "feb30", cron: "0 0 30 2 *" }),
          bad({ name: "mars", timezone: "Mars/Olympus_Mons" }),
          bad({ name: "max", missedFire: { catchUp: { max: 1001 } } }),
          bad({ name: "args", args: { n: "not a number" } }),
          bad({ name: "prio", options: { priority: 7 } }),
          bad({ name: "meta", options: { metadata: { "awa:cronName": "forged" } } }),
          bad({ name: "" }),
          bad({ name: "ok" })
        ])
      )
      assert.instanceOf(error, AwaConfigError)
      assert.deepStrictEqual(
        error.issues.map((i) => i.path),
        [
          "cron.minute61.cron",
          "cron.seven.cron",
          "cron.four.cron",
          "cron.once.cron",
          "cron.colon.cron",
          "cron.feb30.cron",
          "cron.mars.timezone",
          "cron.max.missedFire",
          "cron.args.args",
          "cron.prio.priority",
          "cron.meta.metadata.awa:cronName",
          "cron[12].name",
          "cron.ok"
        ]
      )
      const reason = (path: string) => error.issues.find((i) => i.path === path)!.reason
      assert.match(reason("cron.minute61.cron"), /minute/)
      assert.match(reason("cron.once.cron"), /5 fields, or 6 with seconds \(got 1\)/)
      assert.match(reason("cron.feb30.cron"), /never fires/)
      assert.match(reason("cron.colon.cron"), /is not a cron expression/)
      assert.match(reason("cron.mars.timezone"), /unknown time zone "Mars\/Olympus_Mons"/)
      assert.strictEqual(reason("cron.ok"), "declared twice")
    })
  )
})

describe("tick computation", () => {
  it("nextTick is strictly after its argument, also inside a repeated (fall-back) hour", () => {
    // croner 10.0.1 returns an earlier instant here (01:05 EST → 01:15 EDT); nextTick corrects it
    const ny = parsed("*/15 * * * *", "America/New_York")
    assert.isBelow(ny.nextRun(new Date(at("2026-11-01T06:05:00Z")))!.getTime(), at("2026-11-01T06:05:00Z"))
    assert.strictEqual(iso(Cron.nextTick(ny, at("2026-11-01T06:05:00Z"))!), "2026-11-01T07:00:00.000Z")
    const berlin = parsed("*/15 * * * * *", "Europe/Berlin")
    assert.strictEqual(iso(Cron.nextTick(berlin, at("2026-10-25T01:00:00Z"))!), "2026-10-25T02:00:00.000Z")
  })

  it("latestTick and dueTicks agree with a forward walk, across both DST days of two zones", () => {
    const cases: ReadonlyArray<readonly [string, string, string]> = [
      ["*/15 * * * * *", "America/New_York", "2026-03-08T06:50:00Z"],
      ["*/15 * * * *", "America/New_York", "2026-11-01T04:00:00Z"],
      ["30 2 * * *", "America/New_York", "2026-03-05T00:00:00Z"],
      ["0 * * * *", "Europe/Berlin", "2026-10-24T20:00:00Z"],
      ["*/20 2 * * *", "Europe/Berlin", "2026-03-27T00:00:00Z"],
      ["0 9 * * 1-5", "UTC", "2026-01-01T00:00:00Z"]
    ]
    for (const [expression, timezone, from] of cases) {
      const cron = parsed(expression, timezone)
      const span = expression.startsWith("*/15 * * * * *") ? 3_600_000 : 10 * 86_400_000
      const all = walk(expression, timezone, from, iso(at(from) + span))
      assert.isAbove(all.length, 3, `${expression} ${timezone}`)
      // windows ending on, between and after ticks
      for (let k = 0; k < 40; k++) {
        const until = at(from) + Math.floor((span * (k + 0.5)) / 40) + (k % 3 === 0 ? 0 : 1)
        const after = at(from) + Math.floor((span * k) / 80)
        const expected = all.filter((t) => t > after && t <= until)
        const label = `${expression} ${timezone} (${iso(after)}, ${iso(until)}]`
        assert.strictEqual(Cron.latestTick(cron, after, until), expected.at(-1), label)
        const due = Cron.dueTicks(cron, after, until, 5)
        assert.deepStrictEqual(due.ticks, expected.slice(-5), label)
        assert.strictEqual(due.more, expected.length > 5, label)
      }
    }
  })

  it("a long backlog is not walked whole: the latest 1000 of a day of seconds, or the latest of a week of hours", () => {
    const counting = (cron: ReturnType<typeof parsed>) => {
      let calls = 0
      const nextRun = (d: Date) => {
        calls++
        return cron.nextRun(d)
      }
      const proxy = { nextRun } as unknown as ReturnType<typeof parsed>
      return { proxy, calls: () => calls }
    }
    const seconds = counting(parsed("* * * * * *", "Europe/Berlin"))
    const until = at("2026-10-25T12:00:00.500Z")
    const due = Cron.dueTicks(seconds.proxy, until - 86_400_000, until, 1000)
    assert.deepStrictEqual(
      due.ticks,
      Array.from({ length: 1000 }, (_, i) => at("2026-10-25T12:00:00Z") - (999 - i) * 1000)
    )
    assert.isTrue(due.more)
    assert.isBelow(seconds.calls(), 20_000, "not 86,400 steps")
    const hours = counting(parsed("0 * * * *", "America/New_York"))
    const latest = Cron.dueTicks(hours.proxy, until - 7 * 86_400_000, until, 1)
    assert.deepStrictEqual([latest.ticks.map(iso), latest.more], [["2026-10-25T12:00:00.000Z"], true])
    assert.isBelow(hours.calls(), 100, "not 168 steps")
  })

  it("coalesce plans the latest missed tick, catch-up every one up to its max; new schedules look back one minute", () => {
    const cron = parsed("*/15 * * * * *")
    const last = new Date("2026-03-01T12:00:00Z")
    const now = at("2026-03-01T12:02:31Z") // ten ticks missed: 12:00:15 … 12:02:30
    const changed = new Date("2026-03-01T00:00:00Z")
    const coalesce = Cron.plan(
      cron,
      { lastFireAt: last, scheduleChangedAt: changed, missedFire: { _tag: "Coalesce" } },
      now
    )
    assert.deepStrictEqual(coalesce.ticks.map(iso), ["2026-03-01T12:02:30.000Z"])
    assert.isTrue(coalesce.more)
    const catchUp = Cron.plan(
      cron,
      { lastFireAt: last, scheduleChangedAt: changed, missedFire: { _tag: "CatchUp", max: 100 } },
      now
    )
    assert.strictEqual(catchUp.ticks.length, 10)
    assert.deepStrictEqual(
      [iso(catchUp.ticks[0]!), iso(catchUp.ticks[9]!)],
      ["2026-03-01T12:00:15.000Z", "2026-03-01T12:02:30.000Z"]
    )
    const bounded = Cron.plan(
      cron,
      { lastFireAt: last, scheduleChangedAt: changed, missedFire: { _tag: "CatchUp", max: 3 } },
      now
    )
    assert.deepStrictEqual(bounded.ticks.map(iso), [
      "2026-03-01T12:02:00.000Z",
      "2026-03-01T12:02:15.000Z",
      "2026-03-01T12:02:30.000Z"
    ])
    // never fired, declared at 12:02:00: only ticks from 12:01:00 on, and catch-up does not backfill
    const fresh = Cron.plan(
      cron,
      {
        lastFireAt: null,
        scheduleChangedAt: new Date("2026-03-01T12:02:00Z"),
        missedFire: { _tag: "CatchUp", max: 100 }
      },
      now
    )
    assert.deepStrictEqual(fresh.ticks.map(iso), ["2026-03-01T12:02:30.000Z"])
    const hourly = Cron.plan(
      parsed("0 * * * *"),
      {
        lastFireAt: null,
        scheduleChangedAt: new Date("2026-03-01T12:00:30Z"),
        missedFire: { _tag: "Coalesce" }
      },
      now
    )
    assert.deepStrictEqual(hourly.ticks.map(iso), ["2026-03-01T12:00:00.000Z"])
  })
})

describe("daylight-saving days (croner 10 behaviour, documented in docs/cron.md)", () => {
  const ny = "America/New_York"
  const berlin = "Europe/Berlin"
  const locals = (ticks: ReadonlyArray<number>, timezone: string) => ticks.map((t) => local(t, timezone))

  it("spring forward, New York 2026-03-08 (02:00 EST → 03:00 EDT)", () => {
    // hourly: the missing hour simply has no tick
    assert.deepStrictEqual(
      locals(walk("0 * * * *", ny, "2026-03-08T05:30:00Z", "2026-03-08T08:30:00Z"), ny),
      ["01:00:00 GMT-05:00", "03:00:00 GMT-04:00", "04:00:00 GMT-04:00"]
    )
    // a daily time inside the gap fires once, shifted forward by the gap
    assert.deepStrictEqual(
      locals(walk("30 2 * * *", ny, "2026-03-07T00:00:00Z", "2026-03-10T00:00:00Z"), ny),
      ["02:30:00 GMT-05:00", "03:30:00 GMT-04:00", "02:30:00 GMT-04:00"]
    )
    // several times inside the gap: the first fires shifted, the others that day are dropped
    assert.deepStrictEqual(
      locals(walk("*/20 2 * * *", ny, "2026-03-08T00:00:00Z", "2026-03-09T00:00:00Z"), ny),
      ["03:00:00 GMT-04:00"]
    )
    // a shifted time that coincides with a regular one fires once
    assert.deepStrictEqual(
      locals(walk("15 2,3 * * *", ny, "2026-03-08T00:00:00Z", "2026-03-09T00:00:00Z"), ny),
      ["03:15:00 GMT-04:00"]
    )
    // six fields every 15 s: straight from 01:59:45 EST to 03:00:00 EDT
    assert.deepStrictEqual(
      locals(walk("*/15 * * * * *", ny, "2026-03-08T06:59:30Z", "2026-03-08T07:00:15Z"), ny),
      ["01:59:45 GMT-05:00", "03:00:00 GMT-04:00", "03:00:15 GMT-04:00"]
    )
  })

  it("fall back, New York 2026-11-01 (02:00 EDT → 01:00 EST): the repeated hour runs once, the first time", () => {
    assert.deepStrictEqual(
      locals(walk("30 1 * * *", ny, "2026-10-31T12:00:00Z", "2026-11-02T12:00:00Z"), ny),
      ["01:30:00 GMT-04:00", "01:30:00 GMT-05:00"]
    )
    assert.deepStrictEqual(walk("30 1 * * *", ny, "2026-10-31T12:00:00Z", "2026-11-02T12:00:00Z").map(iso), [
      "2026-11-01T05:30:00.000Z",
      "2026-11-02T06:30:00.000Z"
    ])
    // hourly: 01:00 EDT, then 02:00 EST two hours later
    assert.deepStrictEqual(walk("0 * * * *", ny, "2026-11-01T04:30:00Z", "2026-11-01T08:30:00Z").map(iso), [
      "2026-11-01T05:00:00.000Z",
      "2026-11-01T07:00:00.000Z",
      "2026-11-01T08:00:00.000Z"
    ])
    // every 15 min: nothing during the second 01:00–01:59 (EST), a 75-minute gap
    assert.deepStrictEqual(
      locals(walk("*/15 * * * *", ny, "2026-11-01T05:40:00Z", "2026-11-01T07:20:00Z"), ny),
      ["01:45:00 GMT-04:00", "02:00:00 GMT-05:00", "02:15:00 GMT-05:00"]
    )
  })

  it("Europe/Berlin 2026-03-29 and 2026-10-25 behave the same way", () => {
    assert.deepStrictEqual(
      locals(walk("30 2 * * *", berlin, "2026-03-28T00:00:00Z", "2026-03-31T00:00:00Z"), berlin),
      ["02:30:00 GMT+01:00", "03:30:00 GMT+02:00", "02:30:00 GMT+02:00"]
    )
    // 02:00–02:59 repeats on 2026-10-25: once, in summer time
    assert.deepStrictEqual(
      walk("30 2 * * *", berlin, "2026-10-24T12:00:00Z", "2026-10-26T12:00:00Z").map(iso),
      ["2026-10-25T00:30:00.000Z", "2026-10-26T01:30:00.000Z"]
    )
    assert.deepStrictEqual(
      locals(walk("*/15 * * * * *", berlin, "2026-10-25T00:59:30Z", "2026-10-25T02:00:15Z"), berlin),
      ["02:59:45 GMT+02:00", "03:00:00 GMT+01:00", "03:00:15 GMT+01:00"]
    )
  })
})
