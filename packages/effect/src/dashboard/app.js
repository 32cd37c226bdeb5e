// Awa dashboard (issue 19): a hash-routed page over the admin HTTP API (docs/adr/0026-dashboard.md).
// No framework, no build step: this file is served as is. Polls the API every `pollIntervalMs`.

const view = document.getElementById("view")
const notice = document.getElementById("notice")
const tokenKey = "awa.dashboard.token"
let config = { apiBase: "", pollIntervalMs: 5000, traceLinkTemplate: null, cronPath: "/dashboard/api/cron" }
let caps = { actions: false, readOnly: true, authReads: false }
let timer
let renderSeq = 0
// the filters form has edits not applied yet (a select changed, a field typed in): a poll's redraw
// would throw them away, focused or not (the user may have clicked elsewhere before Filter)
let filtersEdited = false
// page fetches finished, redrawn or held back (tests wait for a poll to have passed)
let polls = 0
// dead letters ticked for a bulk action, kept across the page's redraws
const picked = new Set()

const esc = (value) =>
  String(value ?? "").replace(
    /[&<>"']/g,
    (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]
  )
const token = () => sessionStorage.getItem(tokenKey) ?? ""
const headers = () => (token() === "" ? {} : { authorization: `Bearer ${token()}` })

class ApiError extends Error {
  constructor(status, message) {
    super(message)
    this.status = status
  }
}

async function request(method, path) {
  const url = path === config.cronPath ? path : config.apiBase + path
  const response = await fetch(url, { method, headers: headers() })
  const text = await response.text()
  const body = text === "" ? null : JSON.parse(text)
  if (!response.ok) throw new ApiError(response.status, body?.message ?? `HTTP ${response.status}`)
  return body
}
const get = (path) => request("GET", path)

function say(message, ok = false) {
  notice.textContent = message
  notice.className = ok ? "ok" : ""
  notice.hidden = false
}

/** Runs an action (confirmed first when `question`), reports its outcome, re-renders. */
async function act(method, path, question, done) {
  if (question && !window.confirm(question)) return
  try {
    const body = await request(method, path)
    say(done(body), true)
  } catch (error) {
    const why = error.status === 401 ? "refused: the admin token is missing or wrong" : error.message
    say(`${method} ${path}: ${why}`)
  }
  await render()
}

const age = (iso, now = Date.now()) => {
  if (iso === null || iso === undefined) return "—"
  const s = Math.max(0, Math.round((now - Date.parse(iso)) / 1000))
  if (s < 120) return `${s} s`
  if (s < 7200) return `${Math.round(s / 60)} min`
  return `${Math.round(s / 3600)} h`
}
const when = (iso) => (iso ? new Date(iso).toLocaleString() : "—")
/** A table; `fold` "cards" turns each row into a card of labelled cells in a narrow window (CSS). */
const table = (head, rows, empty, fold = "") =>
  rows.length === 0
    ? `<p class="muted">${empty}</p>`
    : `<div class="table-wrap ${fold}"><table><thead><tr>${head}</tr></thead><tbody>${rows.join("")}</tbody></table></div>`
const button = (label, attrs, danger = false) =>
  caps.actions
    ? `<button type="button" ${attrs}${danger ? ' class="danger"' : ""}>${esc(label)}</button>`
    : ""

function sparkline(series, cls) {
  if (series.length === 0) return `<svg class="spark" width="80" height="18" aria-hidden="true"></svg>`
  // one bucket so far: a level line
  const points = series.length === 1 ? [series[0], series[0]] : series
  const max = Math.max(1, ...points)
  const step = 80 / (points.length - 1)
  const d = points.map((p, i) => `${(i * step).toFixed(1)},${(17 - (p / max) * 16).toFixed(1)}`).join(" ")
  return `<svg class="spark" width="80" height="18" aria-hidden="true"><polyline class="${cls}" fill="none" stroke-width="1.5" points="${d}"/></svg>`
}

/**
 * A queue's last hour from the server's history (the leader's samples, per minute): completions,
 * and the failure rate (failed / finished) per bucket.
 */
function series(history, queue) {
  const buckets = history.queues.find((q) => q.queue === queue)?.buckets ?? []
  return {
    done: buckets.map((b) => b.completed),
    failRate: buckets.map((b) => (b.completed + b.failed === 0 ? 0 : b.failed / (b.completed + b.failed)))
  }
}

// ---------------------------------------------------------------------------------------------
// Pages

async function overview() {
  const [stats, history, status, doctor] = await Promise.all([
    get("/api/queues?window=3600"),
    get("/api/queues/history?window=3600&bucket=60").catch(() => ({ queues: [] })),
    get("/api/status"),
    get("/api/doctor").catch(() => [])
  ])
  const now = Date.parse(stats.asOf)
  const warnings = []
  for (const ring of status.rings) {
    const since = ring.oldestUnpruned?.since
    if (since && now - Date.parse(since) > 10 * 60_000) {
      const blockers = doctor.filter(
        (c) => c.status !== "pass" && /transaction|reclaim|prune/i.test(`${c.name} ${c.detail}`)
      )
      const why =
        blockers.length > 0
          ? blockers.map((c) => `${c.detail} ${c.fix}`).join(" ")
          : "no blocker reported by doctor; is a leader running?"
      warnings.push(
        `Reclamation is blocked on the ${ring.ring} ring: its oldest slot has waited ${age(since, now)}. ${why}`
      )
    }
  }
  if (status.leader === null)
    warnings.push("No maintenance leader holds its lock: nothing reclaims storage or fires cron.")
  const rows = stats.queues.map((q) => {
    const spark = series(history, q.queue)
    const finished = q.recent.completed + q.recent.failed
    const failRate = finished === 0 ? "—" : `${Math.round((100 * q.recent.failed) / finished)} %`
    const perMin = (r) => (q.rates ? `${Math.round(q.rates[r] * 600) / 10}/min` : "—")
    return `<tr data-queue="${esc(q.queue)}"><td data-label="Queue"><a href="#/queue/${encodeURIComponent(q.queue)}">${esc(q.queue)}</a>${q.paused ? ' <span class="badge paused">paused</span>' : ""}</td>
      <td class="num" data-label="Available">${q.available}</td><td class="num" data-label="Running">${q.running}</td><td class="num" data-label="Scheduled">${q.scheduled}</td><td class="num" data-label="Retryable">${q.retryable}</td>
      <td class="num" data-label="Dead"><a href="#/dlq?queue=${encodeURIComponent(q.queue)}">${q.deadLettered}</a></td><td class="num" data-label="Oldest waiting">${age(q.oldestAvailableAt, now)}</td>
      <td class="num" data-label="Enqueued">${perMin("enqueuedPerSecond")}</td>
      <td class="num" data-label="Done (1 h)">${q.recent.completed} ${sparkline(spark.done, "done")}</td><td class="num" data-label="Failed (1 h)">${failRate} ${sparkline(spark.failRate, "fail")}</td></tr>`
  })
  const rings = status.rings
    .map(
      (r) =>
        `<div class="card"><strong>${esc(r.ring)} ring</strong><br>generation ${esc(r.generation)}, slot ${r.slot}<br>oldest unpruned: ${r.oldestUnpruned ? age(r.oldestUnpruned.since, now) : "none"}<br>last prune: ${when(r.lastPrunedAt)}<br><span data-prune="${esc(r.ring)}">prune: ${r.prune ? `${esc(r.prune.outcome)}${r.prune.reason ? ` (${esc(r.prune.reason)})` : ""} since ${when(r.prune.since)}` : "—"}</span></div>`
    )
    .join("")
  return `<h1>Overview</h1>
    ${warnings.map((w) => `<div class="warning" role="alert">${esc(w)}</div>`).join("")}
    <div class="grid">
      <div class="card"><strong>Leader</strong><br>${status.leader ? `pid ${status.leader.pid} (${esc(status.leader.applicationName)}) since ${when(status.leader.since)}` : "none"}</div>
      <div class="card"><strong>Schema</strong><br>version ${status.schemaVersion} of ${status.latestVersion} (${esc(status.schema)})</div>
      ${rings}
    </div>
    <h2>Queues</h2>
    ${table(
      `<th>Queue</th><th class="num">Available</th><th class="num">Running</th><th class="num">Scheduled</th><th class="num">Retryable</th><th class="num">Dead</th><th class="num">Oldest waiting</th><th class="num">Enqueued</th><th class="num">Done (1 h)</th><th class="num">Failed (1 h)</th>`,
      rows,
      "No queues yet.",
      "cards"
    )}
    <p class="muted">Counts as of ${when(stats.asOf)}. Sparklines: the last hour per minute, from the leader's samples (completions; failure rate). ${esc(stats.staleness)}</p>`
}

const states = ["", "available", "running", "scheduled", "retryable", "completed", "failed", "cancelled"]

async function queuePage(name, params) {
  const query = new URLSearchParams({ queue: name, limit: "50" })
  for (const key of ["state", "kind", "tag", "before"]) if (params.get(key)) query.set(key, params.get(key))
  // the time filter: `after`/`until` (datetime-local, the browser's zone) on creation or finalization
  const field = params.get("time") === "finalized" ? "finalized" : "created"
  for (const [key, suffix] of [
    ["after", "After"],
    ["until", "Before"]
  ])
    if (params.get(key)) query.set(`${field}${suffix}`, new Date(params.get(key)).toISOString())
  const [stats, jobs] = await Promise.all([get("/api/queues"), get(`/api/jobs?${query}`)])
  const q = stats.queues.find((x) => x.queue === name)
  const rows = jobs.map(
    (
      j
    ) => `<tr data-job="${esc(j.id)}"><td><a href="#/job/${esc(j.id)}">${esc(j.id)}</a></td><td>${esc(j.kind)}</td><td>${esc(j.state)}</td>
      <td class="num">${j.attempt}/${j.maxAttempts}</td><td class="wide-only">${esc(j.tags.join(", "))}</td><td class="wide-only">${when(j.runAt)}</td></tr>`
  )
  const next =
    jobs.length === 50
      ? `<a id="next-page" href="#/queue/${encodeURIComponent(name)}?${new URLSearchParams({ ...Object.fromEntries(params), before: jobs[jobs.length - 1].id })}">Older →</a>`
      : ""
  const enc = encodeURIComponent(name)
  return `<h1>Queue ${esc(name)} ${q?.paused ? '<span class="badge paused">paused</span>' : ""}</h1>
    ${q ? `<p>${q.available} available · ${q.running} running · ${q.scheduled} scheduled · ${q.retryable} retryable · ${q.deadLettered} dead-lettered</p>` : ""}
    <div class="actions">
      ${q?.paused ? button("Resume", `data-act="resume" data-path="/api/queues/${enc}/resume"`) : button("Pause", `data-act="pause" data-path="/api/queues/${enc}/pause"`)}
      ${button("Drain…", `data-act="drain" data-path="/api/queues/${enc}/drain"`, true)}
    </div>
    <form class="filters" id="filters">
      <label>State <select name="state">${states.map((s) => `<option value="${s}"${params.get("state") === s ? " selected" : ""}>${s || "any"}</option>`).join("")}</select></label>
      <label>Kind <input name="kind" value="${esc(params.get("kind") ?? "")}"></label>
      <label>Tag <input name="tag" value="${esc(params.get("tag") ?? "")}"></label>
      <label>Time <select name="time"><option value="created">created</option><option value="finalized"${field === "finalized" ? " selected" : ""}>finalized</option></select></label>
      <label>After <input type="datetime-local" name="after" value="${esc(params.get("after") ?? "")}"></label>
      <label>Before <input type="datetime-local" name="until" value="${esc(params.get("until") ?? "")}"></label>
      <button type="submit">Filter</button>
    </form>
    ${table(`<th>Id</th><th>Kind</th><th>State</th><th class="num">Attempt</th><th class="wide-only">Tags</th><th class="wide-only">Run at</th>`, rows, "No jobs match.")}
    <p>${params.get("before") ? `<a href="#/queue/${enc}">← Newest</a> ` : ""}${next}</p>`
}

function traceLink(metadata) {
  const traceparent = metadata?.["awa:traceparent"]
  if (typeof traceparent !== "string") return "—"
  const traceId = traceparent.split("-")[1] ?? ""
  if (!config.traceLinkTemplate) return `<code>${esc(traceId)}</code>`
  const href = config.traceLinkTemplate.replace("{traceId}", encodeURIComponent(traceId))
  return `<a href="${esc(href)}" rel="noreferrer">${esc(traceId)}</a>`
}

const errorsTable = (errors) =>
  table(
    `<th class="num">Attempt</th><th>At</th><th>Error</th>`,
    errors.map(
      (e) =>
        `<tr><td class="num">${e.attempt}</td><td>${when(e.at)}</td><td><pre>${esc(e.error)}${e.terminal ? " (terminal)" : ""}</pre></td></tr>`
    ),
    "No errors."
  )

async function jobPage(id) {
  const j = await get(`/api/jobs/${encodeURIComponent(id)}`)
  const open = ["available", "scheduled", "retryable", "running"].includes(j.state)
  return `<h1>Job ${esc(j.id)}</h1>
    <div class="actions">
      ${open ? button("Cancel", `data-act="cancel" data-path="/api/jobs/${esc(j.id)}/cancel"`, true) : button("Retry", `data-act="retry" data-path="/api/jobs/${esc(j.id)}/retry"`)}
    </div>
    <dl class="kv">
      <dt>State</dt><dd id="job-state">${esc(j.state)}${j.dlqReason ? ` (dead-lettered: ${esc(j.dlqReason)}, <a href="#/dlq/${esc(j.id)}">entry</a>)` : ""}</dd>
      <dt>Queue</dt><dd><a href="#/queue/${encodeURIComponent(j.queue)}">${esc(j.queue)}</a></dd>
      <dt>Kind</dt><dd>${esc(j.kind)}</dd>
      <dt>Attempt</dt><dd>${j.attempt} of ${j.maxAttempts} (run lease ${esc(j.runLease)})</dd>
      <dt>Priority</dt><dd>${j.priority}</dd>
      <dt>Created</dt><dd>${when(j.createdAt)}</dd>
      <dt>Run at</dt><dd>${when(j.runAt)}</dd>
      <dt>Finalized</dt><dd>${when(j.finalizedAt)}</dd>
      <dt>Tags</dt><dd>${esc(j.tags.join(", ")) || "—"}</dd>
      <dt>Unique key</dt><dd>${esc(j.uniqueKey ?? "—")}</dd>
      <dt>Trace</dt><dd>${traceLink(j.metadata)}</dd>
    </dl>
    <h2>Args</h2><pre>${esc(JSON.stringify(j.args, null, 2))}</pre>
    <h2>Metadata</h2><pre>${esc(JSON.stringify(j.metadata, null, 2))}</pre>
    <h2>Progress</h2><pre>${esc(JSON.stringify(j.progress, null, 2))}</pre>
    <h2>Attempts</h2>${table(
      `<th class="num">Attempt</th><th>Claimed</th><th>Ended</th><th>Outcome</th><th class="num">Duration</th>`,
      j.attempts.map(
        (a) =>
          `<tr data-attempt="${a.attempt}"><td class="num">${a.attempt}</td><td>${when(a.claimedAt)}</td><td>${when(a.endedAt)}</td><td>${esc(a.outcome ?? "running")}</td><td class="num">${a.durationMs === null ? "—" : `${a.durationMs} ms`}</td></tr>`
      ),
      "No attempt stored (never claimed, or its ring slot was reclaimed: see the errors)."
    )}
    <h2>Errors</h2>${errorsTable(j.errors)}`
}

async function dlqPage(params) {
  const query = new URLSearchParams({ limit: "50" })
  for (const key of ["queue", "kind", "tag", "before"]) if (params.get(key)) query.set(key, params.get(key))
  const entries = await get(`/api/dlq?${query}`)
  const next =
    entries.length === 50
      ? `<a id="dlq-next" href="#/dlq?${new URLSearchParams({ ...Object.fromEntries(params), before: entries[entries.length - 1].id })}">Older →</a>`
      : ""
  const rows = entries.map(
    (
      e
    ) => `<tr data-dlq="${esc(e.id)}">${caps.actions ? `<td><input type="checkbox" class="pick" value="${esc(e.id)}"${picked.has(String(e.id)) ? " checked" : ""} aria-label="select ${esc(e.id)}"></td>` : ""}
      <td><a href="#/dlq/${esc(e.id)}">${esc(e.id)}</a></td><td>${esc(e.queue)}</td><td>${esc(e.kind)}</td><td>${esc(e.reason)}</td><td class="wide-only">${when(e.dlqAt)}</td>
      <td>${button("Retry", `data-act="dlq-retry" data-path="/api/dlq/${esc(e.id)}/retry"`)} ${button("Purge", `data-act="dlq-purge" data-method="DELETE" data-path="/api/dlq/${esc(e.id)}"`, true)}</td></tr>`
  )
  return `<h1>Dead letters${params.get("queue") ? ` of ${esc(params.get("queue"))}` : ""}</h1>
    <form class="filters" id="filters">
      <label>Queue <input name="queue" value="${esc(params.get("queue") ?? "")}"></label>
      <label>Kind <input name="kind" value="${esc(params.get("kind") ?? "")}"></label>
      <label>Tag <input name="tag" value="${esc(params.get("tag") ?? "")}"></label>
      <button type="submit">Filter</button>
    </form>
    <div class="actions">${button("Retry selected", 'data-bulk="retry"')} ${button("Purge selected", 'data-bulk="purge"', true)} <span id="bulk-progress" role="status"></span></div>
    ${table(`${caps.actions ? "<th></th>" : ""}<th>Id</th><th>Queue</th><th>Kind</th><th>Reason</th><th class="wide-only">Dead-lettered</th><th></th>`, rows, "The dead letter queue is empty.")}
    <p>${params.get("before") ? `<a href="#/dlq${params.get("queue") ? `?queue=${encodeURIComponent(params.get("queue"))}` : ""}">← Newest</a> ` : ""}${next}</p>`
}

async function dlqEntryPage(id) {
  const e = await get(`/api/dlq/${encodeURIComponent(id)}`)
  return `<h1>Dead letter ${esc(e.id)}</h1>
    <div class="actions">${button("Retry", `data-act="dlq-retry" data-path="/api/dlq/${esc(e.id)}/retry"`)} ${button("Purge", `data-act="dlq-purge" data-method="DELETE" data-path="/api/dlq/${esc(e.id)}"`, true)}</div>
    <dl class="kv">
      <dt>Reason</dt><dd>${esc(e.reason)}</dd><dt>Queue</dt><dd>${esc(e.queue)}</dd><dt>Kind</dt><dd>${esc(e.kind)}</dd>
      <dt>Attempt</dt><dd>${e.attempt} of ${e.maxAttempts}</dd><dt>Dead-lettered</dt><dd>${when(e.dlqAt)}</dd>
      <dt>Tags</dt><dd>${esc(e.tags.join(", ")) || "—"}</dd><dt>Trace</dt><dd>${traceLink(e.metadata)}</dd>
    </dl>
    <h2>Args</h2><pre>${esc(JSON.stringify(e.args, null, 2))}</pre>
    <h2>Progress</h2><pre>${esc(JSON.stringify(e.progress, null, 2))}</pre>
    <h2>Errors</h2>${errorsTable(e.errors)}`
}

async function cronPage() {
  const { schedules } = await get(config.cronPath)
  const rows = schedules.map((s) => {
    const enc = encodeURIComponent(s.name)
    return `<tr data-cron="${esc(s.name)}"><td>${esc(s.name)}${s.paused ? ' <span class="badge paused">paused</span>' : ""}</td><td><code>${esc(s.expression)}</code></td><td>${esc(s.timezone)}</td>
      <td>${s.nextFireAt ? esc(new Date(s.nextFireAt).toLocaleString(undefined, { timeZone: s.timezone, timeZoneName: "short" })) : esc(s.invalid ?? "—")}</td>
      <td class="wide-only">${when(s.lastFireAt)}</td><td>${s.paused ? button("Resume", `data-act="cron-resume" data-path="/api/cron/${enc}/resume"`) : button("Pause", `data-act="cron-pause" data-path="/api/cron/${enc}/pause"`)} ${button("Trigger now", `data-act="cron-trigger" data-path="/api/cron/${enc}/trigger"`)}</td></tr>`
  })
  return `<h1>Cron</h1>${table(`<th>Name</th><th>Schedule</th><th>Zone</th><th>Next fire (its zone)</th><th class="wide-only">Last fire</th><th></th>`, rows, "No schedules.")}`
}

// ---------------------------------------------------------------------------------------------
// Routing, actions and polling

const questions = {
  drain: "Drain this queue? Every available, scheduled and retryable job is cancelled.",
  cancel: "Cancel this job?",
  "dlq-purge": "Purge this dead letter for good?"
}
const outcomes = {
  pause: (b) => `paused ${b.queue}`,
  resume: (b) => `resumed ${b.queue}`,
  drain: (b) => `drained ${b.queue}: ${b.cancelled} jobs cancelled`,
  cancel: (b) => `job ${b.id} is ${b.state}`,
  retry: (b) => `job ${b.id} is ${b.state}`,
  "dlq-retry": (b) => `job ${b.id} is back: ${b.state}`,
  "dlq-purge": () => "purged",
  "cron-pause": (b) => `paused ${b.name}`,
  "cron-resume": (b) => `resumed ${b.name}`,
  "cron-trigger": (b) => `triggered: job ${b.id} is ${b.state}`
}

function route() {
  const [path, search = ""] = location.hash.replace(/^#/, "").split("?")
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent)
  return { parts, params: new URLSearchParams(search) }
}

async function page() {
  const { parts, params } = route()
  if (parts[0] === "queue" && parts[1]) return queuePage(parts[1], params)
  if (parts[0] === "job" && parts[1]) return jobPage(parts[1])
  if (parts[0] === "dlq" && parts[1]) return dlqEntryPage(parts[1])
  if (parts[0] === "dlq") return dlqPage(params)
  if (parts[0] === "cron") return cronPage()
  return overview()
}

/** A selector for the focused control inside the view, to find it again after a redraw. */
function focusKey(element) {
  if (!element || !view.contains(element) || element === view) return null
  const attr = ["data-path", "data-bulk", "href", "value"].find((name) => element.hasAttribute(name))
  return attr ? `${element.tagName.toLowerCase()}[${attr}="${CSS.escape(element.getAttribute(attr))}"]` : null
}

async function render() {
  const seq = ++renderSeq
  try {
    const html = await page()
    if (seq !== renderSeq) return
    view.dataset.polls = String(++polls)
    // keep filter edits across a poll: skip the redraw while the form has edits not applied, or
    // one of its fields is focused
    if (filtersEdited || document.activeElement?.closest?.("#filters")) return
    const focused = focusKey(document.activeElement)
    view.innerHTML = html
    // a keyboard user's focus survives the redraw: the same link, button or box is focused again
    if (focused) view.querySelector(focused)?.focus()
    view.dataset.page = route().parts[0] ?? "overview"
    // what the view now shows (tests and scripts wait for it)
    view.dataset.route = location.hash || "#/"
    document.getElementById("updated").textContent =
      `Updated ${new Date().toLocaleTimeString()} · refreshes every ${config.pollIntervalMs / 1000} s`
  } catch (error) {
    if (seq === renderSeq) view.innerHTML = `<p class="warning" role="alert">${esc(error.message)}</p>`
  }
}

function schedule() {
  clearTimeout(timer)
  timer = setTimeout(async () => {
    await render()
    schedule()
  }, config.pollIntervalMs)
}

async function bulk(kind) {
  const ids = [...view.querySelectorAll("input.pick:checked")].map((x) => x.value)
  picked.clear()
  if (ids.length === 0) return say("select dead letters first")
  if (kind === "purge" && !window.confirm(`Purge ${ids.length} dead letters for good?`)) return
  const progress = document.getElementById("bulk-progress")
  let done = 0
  for (const id of ids) {
    try {
      if (kind === "retry") await request("POST", `/api/dlq/${id}/retry`)
      else await request("DELETE", `/api/dlq/${id}`)
      done++
      progress.textContent = `${done} of ${ids.length}`
    } catch (error) {
      say(
        `${kind} ${id}: ${error.status === 401 ? "refused: the admin token is missing or wrong" : error.message}`
      )
      return render()
    }
  }
  say(`${kind === "retry" ? "retried" : "purged"} ${done} of ${ids.length} dead letters`, true)
  await render()
}

view.addEventListener("click", (event) => {
  const target = event.target.closest("button[data-act], button[data-bulk]")
  if (!target) return
  if (target.dataset.bulk) return void bulk(target.dataset.bulk)
  const act_ = target.dataset.act
  void act(target.dataset.method ?? "POST", target.dataset.path, questions[act_], outcomes[act_])
})

const noteFilterEdit = (event) => {
  if (event.target.closest?.("#filters")) filtersEdited = true
}
view.addEventListener("input", noteFilterEdit)

view.addEventListener("change", (event) => {
  noteFilterEdit(event)
  const box = event.target
  if (!box.classList?.contains("pick")) return
  if (box.checked) picked.add(box.value)
  else picked.delete(box.value)
})

view.addEventListener("submit", (event) => {
  if (event.target.id !== "filters") return
  event.preventDefault()
  const { parts } = route()
  const data = new URLSearchParams()
  for (const [key, value] of new FormData(event.target)) if (value !== "") data.set(key, value)
  // the time field only matters with a bound
  if (!data.has("after") && !data.has("until")) data.delete("time")
  filtersEdited = false
  document.activeElement?.blur?.()
  location.hash = `#/${parts.map(encodeURIComponent).join("/")}${data.size > 0 ? `?${data}` : ""}`
})

document.getElementById("token-form").addEventListener("submit", (event) => {
  event.preventDefault()
  const input = document.getElementById("token")
  sessionStorage.setItem(tokenKey, input.value)
  input.value = ""
  showMode()
  say("token kept for this browser tab", true)
})

function showMode() {
  document.getElementById("mode").textContent = caps.actions
    ? token() === ""
      ? "no token: actions will be refused"
      : "token set"
    : "read-only"
  document
    .getElementById("token-form")
    .querySelectorAll("input,button")
    .forEach((x) => {
      x.hidden = !caps.actions
    })
  document.querySelector('label[for="token"]').hidden = !caps.actions
}

window.addEventListener("hashchange", () => {
  notice.hidden = true
  // another page, or the filters applied: nothing pending any more
  filtersEdited = false
  void render().then(() => view.focus())
})

async function start() {
  config = { ...config, ...JSON.parse(document.getElementById("awa-config").textContent) }
  caps = await get("/api/capabilities").catch(() => caps)
  showMode()
  await render()
  schedule()
}
void start()
