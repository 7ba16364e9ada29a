// fedpeer console: polls the console's small JSON API and redraws the page; draws each learning
// curve as an SVG polyline. No framework, no external asset. Every text from a daemon (peer names,
// errors, results) goes into the page as text (textContent), never as markup.
"use strict";

// The page's session with the console: exchanged once for the URL's one-time token, then sent as
// a header with every request. It lives in this tab's sessionStorage (this origin's only, port
// included), never in a cookie: cookies do not tell loopback ports apart.
const SESSION_HEADER = "X-Fedpeer-Session";
const SESSION_KEY = "fedpeer-console-session";
const ASK_FRESH = "ask the console for a fresh URL (press Enter where `fedpeer console` runs, or send it SIGUSR1)";
const POLL_MS = Number(document.querySelector('meta[name="fedpeer-poll-ms"]').content) || 1000;
const CURVE_W = 380, CURVE_H = 230;                            // px, one chart per series
const COMPARE_W = 470, LEGEND_H = 34;                          // px: a chart of two jobs is wider, its legend below
const COLOURS = ["#2457c5", "#c4320a"];                        // the selected job's curve, the compared job's
const PAD = { left: 62, right: 12, top: 36, bottom: 44 };      // px around the plot area (titles and axis titles in it)
const TICKS = 5;                                               // labelled ticks per axis
const TERMINAL = ["done", "failed", "cancelled"];

let kinds = [];
let selected = null;          // the job id shown below the list
let compared = null;          // a second job whose curves are drawn on the selected job's charts
let lastDrawn = "";           // the selected (and compared) job's JSON last drawn (redraw only on change)
let compareChoices = "";      // the compare menu's jobs last offered (rebuilt only on change)

function $(id) { return document.getElementById(id); }

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}

let session = sessionStorage.getItem(SESSION_KEY);

async function request(path, options, headers) {
  const init = Object.assign({ credentials: "omit", cache: "no-store" }, options || {});
  init.headers = Object.assign({}, headers || {}, init.headers || {});
  const response = await fetch(path, init);
  let doc = null;
  try { doc = await response.json(); } catch (_) { doc = { error: `HTTP ${response.status}` }; }
  if (!response.ok) {
    if (response.status === 403 && doc && doc.session === "unknown") {
      sessionStorage.removeItem(SESSION_KEY);      // the console restarted, or dropped this page's session
      session = null;
    }
    throw new Error((doc && doc.error) || `HTTP ${response.status}`);
  }
  return doc;
}

async function api(path, options) {
  if (!session) throw new Error(`this page holds no console session: ${ASK_FRESH}, and open it`);
  return request(path, options, { [SESSION_HEADER]: session });
}

// The URL's token, spent once for this page's session; it leaves the address bar (and the
// history) before anything else happens.
async function openSession() {
  const token = new URLSearchParams(location.search).get("token");
  if (token === null) return;
  history.replaceState(null, "", "/" + location.hash);    // a job's link (#job=ID) stays
  const doc = await request("/api/session", {
    method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ token }) });
  session = doc.session;
  sessionStorage.setItem(SESSION_KEY, session);
}

function banner(text) {
  const b = $("banner");
  b.hidden = !text;
  b.textContent = text || "";
}

function fmtBytes(n) {
  if (n === null || n === undefined) return "-";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${i ? n.toFixed(1) : n} ${units[i]}`;
}

function fmtNum(v) {
  if (v === null || v === undefined) return "-";
  if (typeof v !== "number") return String(v);
  if (Number.isInteger(v)) return String(v);
  const a = Math.abs(v);
  return a !== 0 && (a < 1e-3 || a >= 1e6) ? v.toExponential(3) : String(Number(v.toPrecision(5)));
}

function sum(obj) { return obj ? Object.values(obj).reduce((a, b) => a + b, 0) : null; }

// -- federation -------------------------------------------------------------------------------

function drawStatus(doc) {
  const node = doc.node;
  $("site-name").textContent = `— ${node.name}`;
  $("node-line").textContent = `${node.address} · fingerprint ${node.fingerprint} · up ${Math.round(node.uptime_s)} s`;
  $("leader-line").textContent = `leader: ${doc.leader || "none yet"} · term ${doc.term ?? 0} · this site is ${doc.role || "-"}`;
  const body = $("peers").querySelector("tbody");
  body.replaceChildren(...doc.peers.map((p) => {
    const tr = el("tr");
    tr.dataset.peer = p.name;
    tr.append(el("td", p.name), el("td", p.state, `state-${p.state}`),
              el("td", p.rtt_ms === null ? "-" : `${p.rtt_ms.toFixed(1)} ms`, "num"),
              el("td", p.last_seen_s === null ? "never" : `${p.last_seen_s.toFixed(1)} s ago`, "num"),
              el("td", fmtBytes(sum(p.sent_bytes)), "num"), el("td", fmtBytes(sum(p.received_bytes)), "num"),
              el("td", p.address));
    return tr;
  }));
}

// -- jobs -------------------------------------------------------------------------------------

function progressCell(p) {
  const td = el("td", null, "num");
  if (p && p.total) {
    const bar = el("span", null, "mini"), fill = el("span");
    fill.style.width = `${Math.min(100, (100 * p.step) / p.total)}%`;
    bar.append(fill);
    td.append(bar, document.createTextNode(`${p.step} / ${p.total}`));
  } else {
    td.textContent = "-";
  }
  return td;
}

function drawJobs(doc) {
  const jobs = doc.jobs || [];
  $("no-jobs").hidden = jobs.length > 0;
  if (selected === null && jobs.length) select(jobs[0].id);
  drawCompareChoices(jobs);
  const body = $("jobs").querySelector("tbody");
  body.replaceChildren(...jobs.map((j) => {
    const tr = el("tr");
    tr.dataset.job = j.id;
    if (j.id === selected) tr.className = "selected";
    tr.append(el("td", j.id), el("td", j.kind), el("td", j.state, `state-${j.state}`), el("td", j.phase),
              progressCell(j.progress), el("td", j.elapsed_s === null ? "-" : `${j.elapsed_s.toFixed(1)} s`, "num"),
              el("td", j.epsilon_spent || "-", "num epsilon"));
    tr.addEventListener("click", () => select(j.id));
    return tr;
  }));
}

// A job's own URL: this page with #job=ID (in this tab, whose session it uses), and with
// &compare=ID2 when a second job's curves are drawn on its charts.
function fromHash(key) {
  const value = new URLSearchParams(location.hash.slice(1)).get(key);
  return value === null || value === "" ? null : value;
}

function jobHash() {
  return `#job=${encodeURIComponent(selected)}` + (compared ? `&compare=${encodeURIComponent(compared)}` : "");
}

function select(id, other) {
  selected = id;
  compared = other && other !== id ? other : null;
  lastDrawn = "";
  compareChoices = "";
  if (location.hash !== jobHash()) history.replaceState(null, "", "/" + jobHash());
  for (const tr of $("jobs").querySelectorAll("tbody tr")) tr.className = tr.dataset.job === id ? "selected" : "";
  pollJob();
}

function compare(id) {
  select(selected, id || null);
}

// The compare menu: every other job whose kind records curves, the selected job's kind first;
// the charts overlay the series both jobs have (the same metric).
function drawCompareChoices(jobs) {
  const withCurves = new Set(kinds.filter((k) => k.curves).map((k) => k.name));
  const mine = jobs.find((j) => j.id === selected);
  const others = jobs.filter((j) => j.id !== selected && (withCurves.has(j.kind) || !kinds.length))
    .sort((a, b) => (b.kind === (mine && mine.kind)) - (a.kind === (mine && mine.kind)));
  const key = JSON.stringify([selected, compared, others.map((j) => [j.id, j.kind])]);
  if (key === compareChoices) return;
  compareChoices = key;
  const none = el("option", "no other job");
  none.value = "";
  const options = others.map((j) => { const o = el("option", `${j.id} (${j.kind})`); o.value = j.id; return o; });
  if (compared && !others.some((j) => j.id === compared)) {   // a linked job this site's list does not hold
    const o = el("option", compared);
    o.value = compared;
    options.push(o);
  }
  $("compare").replaceChildren(none, ...options);
  $("compare").value = compared || "";
}

// -- one job ----------------------------------------------------------------------------------

function drawJob(job, other) {
  const text = JSON.stringify([job, other]);
  if (text === lastDrawn) return;
  lastDrawn = text;
  $("job-section").hidden = false;
  $("job-section").dataset.state = job.state;
  $("job-id").textContent = `${job.id} (${job.kind})`;
  $("job-link").href = "/" + jobHash();
  const p = job.progress || {};
  const step = p.total ? ` · step ${p.step} of ${p.total}` : "";
  const elapsed = job.elapsed_s === null ? "" : ` · ${job.elapsed_s.toFixed(1)} s`;
  $("job-line").textContent = `${job.state} — ${job.phase}${step}${elapsed} · proposed by ${job.proposer}`;
  $("job-line").className = `state-${job.state}`;
  const done = job.state === "done" ? 100 : p.total ? (100 * p.step) / p.total : 0;
  $("job-progress").style.width = `${Math.min(100, done)}%`;
  $("job-error").hidden = !job.error;
  $("job-error").textContent = job.error || "";
  $("cancel-button").hidden = TERMINAL.includes(job.state);
  drawCurves(chartsOf(job), other);
  drawCard(job.card || {}, job.privacy);
  drawSites(job.sites || [], job.site_table);
}

function chartsOf(job) {
  return job.charts || Object.entries(job.curves || {}).map(([name, points]) => (
    { name, points, x_title: "round", y_title: name, y_range: null }));
}

// About TICKS values at round steps (1, 2 or 5 times a power of ten) within [lo, hi].
function ticks(lo, hi) {
  const raw = (hi - lo) / TICKS, power = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 5, 10].map((m) => m * power).find((s) => s >= raw) || raw;
  const out = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(Number(v.toPrecision(12)));
  return out;
}

function svgEl(tag, attrs, text) {
  const e = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
  if (text !== undefined) e.textContent = text;
  return e;
}

// An axis title's measure ("AUC"), drawn along the y axis, and what it says of the rows ("103
// held-out rows per point"), drawn under the chart's title (or in the legend of two jobs).
function titleParts(title) {
  const i = title.indexOf(" · ");
  return i < 0 ? [title, ""] : [title.slice(0, i), title.slice(i + 3)];
}

// One chart: the selected job's series, and with `other` (the compared job's chart of the same
// series) both curves on the same axes, a legend below naming each job and the rows it rests on.
function curve(chart, other) {
  const { name, points } = chart;
  const width = other ? COMPARE_W : CURVE_W, height = CURVE_H + (other ? LEGEND_H : 0);
  const svg = svgEl("svg", { class: "curve", width, height, viewBox: `0 0 ${width} ${height}`,
                             xmlns: "http://www.w3.org/2000/svg", "data-series": name, "data-points": points.length });
  const all = other ? points.concat(other.points) : points;
  const xs = all.map((q) => q[0]), ys = all.map((q) => q[1]);
  let [x0, x1] = [Math.min(...xs), Math.max(...xs)], [y0, y1] = [Math.min(...ys), Math.max(...ys)];
  if (chart.y_range && (!other || other.y_range)) [y0, y1] = chart.y_range;   // bounded: its whole range, never a zoom
  if (x0 === x1) { x0 -= 1; x1 += 1; }
  if (y0 === y1) { const d = Math.abs(y0) * 0.05 || 1; y0 -= d; y1 += d; }
  const w = width - PAD.left - PAD.right, h = CURVE_H - PAD.top - PAD.bottom;
  const sx = (x) => PAD.left + ((x - x0) / (x1 - x0)) * w, sy = (y) => PAD.top + h - ((y - y0) / (y1 - y0)) * h;
  const [measure, rows] = titleParts(chart.y_title);
  svg.append(svgEl("text", { x: PAD.left, y: 14, class: "title" }, name));
  if (rows && !other) svg.append(svgEl("text", { x: PAD.left, y: 28, class: "rows" }, rows));   // what each point rests on
  svg.append(svgEl("text", { x: PAD.left + w / 2, y: CURVE_H - 6, "text-anchor": "middle", class: "axis-title x" },
                   chart.x_title));
  svg.append(svgEl("text", { x: 12, y: PAD.top + h / 2, "text-anchor": "middle", class: "axis-title y",
                             transform: `rotate(-90 12 ${PAD.top + h / 2})` }, measure));
  for (const y of ticks(y0, y1)) {
    svg.append(svgEl("line", { x1: PAD.left, x2: PAD.left + w, y1: sy(y), y2: sy(y), class: "grid" }));
    svg.append(svgEl("text", { x: PAD.left - 4, y: sy(y) + 3, "text-anchor": "end", class: "tick" }, fmtNum(y)));
  }
  for (const x of ticks(x0, x1)) {
    svg.append(svgEl("line", { x1: sx(x), x2: sx(x), y1: PAD.top + h, y2: PAD.top + h + 4, class: "axis" }));
    svg.append(svgEl("text", { x: sx(x), y: PAD.top + h + 15, "text-anchor": "middle", class: "tick" }, fmtNum(x)));
  }
  svg.append(svgEl("line", { x1: PAD.left, x2: PAD.left, y1: PAD.top, y2: PAD.top + h, class: "axis" }));
  svg.append(svgEl("line", { x1: PAD.left, x2: PAD.left + w, y1: PAD.top + h, y2: PAD.top + h, class: "axis" }));
  const series = [[points, COLOURS[0], "", selected, rows]];
  if (other) series.push([other.points, COLOURS[1], "6 3", compared, titleParts(other.y_title)[1]]);
  series.forEach(([pts, colour, dash, job, said], i) => {
    svg.append(svgEl("polyline", { fill: "none", stroke: colour, "stroke-width": 2, "stroke-dasharray": dash || "none",
                                   class: i ? "compare" : "own", "data-job": job,
                                   points: pts.map((q) => `${sx(q[0]).toFixed(1)},${sy(q[1]).toFixed(1)}`).join(" ") }));
    if (pts.length <= 60) for (const q of pts) svg.append(svgEl("circle", { cx: sx(q[0]), cy: sy(q[1]), r: 2.5, fill: colour }));
    if (other) {           // the legend: which line is which job, on how many rows its points rest
      const y = CURVE_H + 4 + i * 15;
      svg.append(svgEl("line", { x1: PAD.left, x2: PAD.left + 22, y1: y, y2: y, stroke: colour, "stroke-width": 2,
                                 "stroke-dasharray": dash || "none" }));
      svg.append(svgEl("text", { x: PAD.left + 28, y: y + 3.5, class: "legend" }, said ? `${job} · ${said}` : job));
    }
  });
  if (other) svg.dataset.compare = compared;
  return svg;
}

// A chart's data as CSV: x, then one column per job (empty where a job has no point at that x).
function chartCsv(chart, other) {
  if (!other) return `${chart.x_title},${chart.name}\n` + chart.points.map((q) => `${q[0]},${q[1]}`).join("\n") + "\n";
  const own = new Map(chart.points.map((q) => [q[0], q[1]])), theirs = new Map(other.points.map((q) => [q[0], q[1]]));
  const xs = [...new Set([...own.keys(), ...theirs.keys()])].sort((a, b) => a - b);
  return `${chart.x_title},${selected} ${chart.name},${compared} ${chart.name}\n`
    + xs.map((x) => `${x},${own.has(x) ? own.get(x) : ""},${theirs.has(x) ? theirs.get(x) : ""}`).join("\n") + "\n";
}

function download(filename, type, text) {
  const a = el("a");
  a.href = URL.createObjectURL(new Blob([text], { type }));
  a.download = filename;
  a.click();
  setTimeout(() => URL.revokeObjectURL(a.href), 1000);
}

// One chart with its data as CSV and itself as SVG, both downloaded from what the page holds.
function chartBox(chart, other) {
  const box = el("figure", null, "chart");
  const svg = curve(chart, other);
  const csv = el("button", "CSV"), image = el("button", "SVG");
  csv.type = image.type = "button";
  csv.className = "download-csv";
  image.className = "download-svg";
  const base = other ? `${selected}-vs-${compared}-${chart.name}` : `${selected}-${chart.name}`;
  csv.addEventListener("click", () => download(`${base}.csv`, "text/csv", chartCsv(chart, other)));
  image.addEventListener("click", () => download(`${base}.svg`, "image/svg+xml",
    new XMLSerializer().serializeToString(svg)));
  box.append(svg, csv, image);
  return box;
}

// The selected job's charts; with a compared job (its record `other`), each series both have on one chart.
function drawCurves(charts, other) {
  const shown = charts.filter((c) => c.points.length > 0);
  const theirs = new Map((other ? chartsOf(other) : []).filter((c) => c.points.length > 0).map((c) => [c.name, c]));
  $("no-curves").hidden = shown.length > 0;
  $("curves").replaceChildren(...shown.map((c) => chartBox(c, theirs.get(c.name))));
  const note = $("compare-note");
  const common = shown.filter((c) => theirs.has(c.name)).length;
  note.hidden = !compared || (other !== null && common > 0);
  note.textContent = !compared ? "" : other === null ? `${compared}: not found at this site`
    : `${compared} has no curve in common with ${selected} yet`;
}

function cardRow(label, value) {
  const tr = el("tr");
  const td = el("td");
  if (value instanceof Node) td.append(value); else td.textContent = value === null || value === undefined ? "-" : value;
  tr.append(el("th", label), td);
  return tr;
}

// A DP job's privacy (views.py `privacy`): ε and δ each site's ledger charges, and the accountant's count.
function privacyText(privacy) {
  const fmt = (e, d) => `ε ${Number(e.toPrecision(3))} (δ ${d.toExponential(1)})`;
  const parts = privacy.sites.map((s) => `${s.name}: ${fmt(s.epsilon, s.delta)}`);
  const counted = privacy.counted && privacy.counted.epsilon !== null
    ? `; counted by the job's accountant ${fmt(privacy.counted.epsilon, privacy.counted.delta)}` : "";
  return `${parts.join(", ") || "not charged yet"}${counted}`;
}

function drawCard(card, privacy) {
  const rows = [cardRow("kind", card.help ? `${card.kind} — ${card.help}` : card.kind)];
  if (privacy) rows.push(cardRow("differential privacy, ε spent", privacyText(privacy)));
  if (card.mode) rows.push(cardRow("mode", card.mode));
  const changed = Object.entries(card.params_changed || {});
  rows.push(cardRow("parameters (not default)", changed.length ? changed.map(([k, v]) => `${k}=${JSON.stringify(v)}`).join(", ") : "all defaults"));
  rows.push(cardRow("members", (card.members || []).join(", ")));
  rows.push(cardRow("data fingerprint", card.data_fingerprint || "- (the kind reads no data)"));
  if (card.model_sha256) rows.push(cardRow("model sha256", card.model_sha256));
  const metrics = card.metrics || [];
  if (metrics.length) {
    const t = el("table");
    t.append(...[["metric", "value", "test rows", "on"], ...metrics.map((m) => [m.name, fmtNum(m.value), m.rows ?? "-", m.source ?? "-"])]
      .map((r, i) => { const tr = el("tr"); tr.append(...r.map((c) => el(i ? "td" : "th", c))); return tr; }));
    rows.push(cardRow("metrics", t));
  } else {
    rows.push(cardRow("metrics", "none yet"));
  }
  $("card").querySelector("tbody").replaceChildren(...rows);
}

function drawSites(sites, siteTable) {
  $("sites").querySelector("tbody").replaceChildren(...sites.map((s) => {
    const tr = el("tr");
    const metrics = (s.metrics || []).slice(0, 6).map((m) => `${m.name} ${fmtNum(m.value)}`).join(", ");
    tr.append(el("td", s.name), el("td", s.read ? s.state : "-", s.read ? `state-${s.state}` : "muted"),
              el("td", s.rows ?? "-", "num"), el("td", s.elapsed_s === null || s.elapsed_s === undefined ? "-" : `${s.elapsed_s.toFixed(1)} s`, "num"),
              el("td", s.read ? (s.error || metrics || "-") : s.note, s.read ? (s.error ? "error" : "") : "muted"));
    return tr;
  }));
  $("site-table").hidden = !siteTable;
  $("site-table").textContent = siteTable || "";
}

// -- the form ---------------------------------------------------------------------------------

function paramInput(p) {
  let input;
  if (p.choices) {
    input = el("select");
    for (const c of p.choices) { const o = el("option", c); o.value = String(c); input.append(o); }
    input.value = String(p.default);
  } else if (p.type === "bool") {
    input = el("input");
    input.type = "checkbox";
    input.checked = Boolean(p.default);
  } else {
    input = el("input");
    input.type = p.type === "str" ? "text" : "number";
    if (p.type === "float") input.step = "any";
    if (p.type !== "str" && p.low !== null) input.min = p.low;
    if (p.type !== "str" && p.high !== null) input.max = p.high;
    input.value = String(p.default);
  }
  input.id = `param-${p.name}`;
  input.name = p.name;
  input.dataset.type = p.type;
  return input;
}

function drawForm() {
  const kind = kinds.find((k) => k.name === $("kind").value);
  if (!kind) return;
  $("kind-help").textContent = kind.help + (kind.curves ? "" : " (records no learning curve)");
  const box = $("params");
  box.replaceChildren();
  for (const p of kind.params) {
    const label = el("label", p.name);
    label.htmlFor = `param-${p.name}`;
    box.append(label, paramInput(p), el("span", p.help, "help"));
  }
}

async function loadKinds() {
  const doc = await api("/api/kinds");
  kinds = doc.kinds;
  $("kind").replaceChildren(...kinds.map((k) => { const o = el("option", k.name); o.value = k.name; return o; }));
  drawForm();
}

async function propose(event) {
  event.preventDefault();
  const params = {};
  for (const input of $("params").querySelectorAll("input, select")) {
    params[input.name] = input.type === "checkbox" ? input.checked : input.value;
  }
  const message = $("propose-message");
  message.className = "";
  message.textContent = "proposing…";
  try {
    const doc = await api("/api/jobs", {
      method: "POST", headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ kind: $("kind").value, params, members: $("members").value }),
    });
    message.textContent = `proposed ${doc.id}`;
    select(doc.id);
    pollJobs();
  } catch (err) {
    message.className = "error";
    message.textContent = err.message;
  }
}

async function cancel() {
  if (!selected) return;
  try {
    await api(`/api/jobs/${encodeURIComponent(selected)}/cancel`, {
      method: "POST", headers: { "Content-Type": "application/json" }, body: "{}" });
  } catch (err) {
    $("job-error").hidden = false;
    $("job-error").textContent = err.message;
  }
}

// -- polling ----------------------------------------------------------------------------------

async function pollStatus() { drawStatus(await api("/api/status")); }
async function pollJobs() { drawJobs(await api("/api/jobs")); }
async function pollJob() {
  if (selected === null) return;
  const [job, other] = await Promise.all([
    api(`/api/jobs/${encodeURIComponent(selected)}`),
    compared === null ? null : api(`/api/jobs/${encodeURIComponent(compared)}`).catch(() => null)]);
  drawJob(job, other);
}

async function tick() {
  try {
    await Promise.all([pollStatus(), pollJobs(), pollJob()]);
    if (!kinds.length) await loadKinds();
    banner("");
  } catch (err) {
    banner(err.message);
  } finally {
    setTimeout(tick, POLL_MS);
  }
}

document.addEventListener("DOMContentLoaded", async () => {
  $("kind").addEventListener("change", drawForm);
  $("propose").addEventListener("submit", propose);
  $("cancel-button").addEventListener("click", cancel);
  $("compare").addEventListener("change", () => compare($("compare").value));
  try {
    await openSession();
  } catch (err) {
    banner(err.message);
    return;
  }
  if (!session) {
    banner(`no console token: open the URL \`fedpeer console\` printed (it ends in ?token=...); ${ASK_FRESH}`);
    return;
  }
  loadKinds().catch((err) => banner(err.message));
  const linked = fromHash("job");
  if (linked !== null) select(linked, fromHash("compare"));
  window.addEventListener("hashchange", () => {
    const id = fromHash("job"), other = fromHash("compare");
    if (id !== null && (id !== selected || other !== compared)) select(id, other);
  });
  tick();
});
