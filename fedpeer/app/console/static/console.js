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
const PAD = { left: 62, right: 12, top: 22, bottom: 44 };      // px around the plot area (axis titles in it)
const TICKS = 5;                                               // labelled ticks per axis
const TERMINAL = ["done", "failed", "cancelled"];

let kinds = [];
let selected = null;          // the job id shown below the list
let lastDrawn = "";           // the selected job's JSON last drawn (redraw only on change)

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

// A job's own URL: this page with #job=ID (in this tab, whose session it uses).
function jobFromHash() {
  const m = /^#job=(.+)$/.exec(location.hash);
  return m ? decodeURIComponent(m[1]) : null;
}

function select(id) {
  selected = id;
  lastDrawn = "";
  if (jobFromHash() !== id) history.replaceState(null, "", `/#job=${encodeURIComponent(id)}`);
  for (const tr of $("jobs").querySelectorAll("tbody tr")) tr.className = tr.dataset.job === id ? "selected" : "";
  pollJob();
}

// -- one job ----------------------------------------------------------------------------------

function drawJob(job) {
  const text = JSON.stringify(job);
  if (text === lastDrawn) return;
  lastDrawn = text;
  $("job-section").hidden = false;
  $("job-section").dataset.state = job.state;
  $("job-id").textContent = `${job.id} (${job.kind})`;
  $("job-link").href = `/#job=${encodeURIComponent(job.id)}`;
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
  drawCurves(job.charts || Object.entries(job.curves || {}).map(([name, points]) => (
    { name, points, x_title: "round", y_title: name, y_range: null })));
  drawCard(job.card || {}, job.privacy);
  drawSites(job.sites || [], job.site_table);
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

function curve(chart) {
  const { name, points } = chart;
  const svg = svgEl("svg", { class: "curve", width: CURVE_W, height: CURVE_H, viewBox: `0 0 ${CURVE_W} ${CURVE_H}`,
                             xmlns: "http://www.w3.org/2000/svg", "data-series": name, "data-points": points.length });
  const xs = points.map((q) => q[0]), ys = points.map((q) => q[1]);
  let [x0, x1] = [Math.min(...xs), Math.max(...xs)], [y0, y1] = [Math.min(...ys), Math.max(...ys)];
  if (chart.y_range) [y0, y1] = chart.y_range;      // a bounded metric on its whole range, never a zoom
  if (x0 === x1) { x0 -= 1; x1 += 1; }
  if (y0 === y1) { const d = Math.abs(y0) * 0.05 || 1; y0 -= d; y1 += d; }
  const w = CURVE_W - PAD.left - PAD.right, h = CURVE_H - PAD.top - PAD.bottom;
  const sx = (x) => PAD.left + ((x - x0) / (x1 - x0)) * w, sy = (y) => PAD.top + h - ((y - y0) / (y1 - y0)) * h;
  svg.append(svgEl("text", { x: PAD.left, y: 14, class: "title" }, name));
  svg.append(svgEl("text", { x: PAD.left + w / 2, y: CURVE_H - 6, "text-anchor": "middle", class: "axis-title x" },
                   chart.x_title));
  svg.append(svgEl("text", { x: 12, y: PAD.top + h / 2, "text-anchor": "middle", class: "axis-title y",
                             transform: `rotate(-90 12 ${PAD.top + h / 2})` }, chart.y_title));
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
  svg.append(svgEl("polyline", { fill: "none", stroke: "#2457c5", "stroke-width": 2, points: points.map((q) => `${sx(q[0]).toFixed(1)},${sy(q[1]).toFixed(1)}`).join(" ") }));
  if (points.length <= 60) for (const q of points) svg.append(svgEl("circle", { cx: sx(q[0]), cy: sy(q[1]), r: 2.5 }));
  return svg;
}

function download(filename, type, text) {
  const a = el("a");
  a.href = URL.createObjectURL(new Blob([text], { type }));
  a.download = filename;
  a.click();
  setTimeout(() => URL.revokeObjectURL(a.href), 1000);
}

// One chart with its data as CSV and itself as SVG, both downloaded from what the page holds.
function chartBox(chart) {
  const box = el("figure", null, "chart");
  const svg = curve(chart);
  const csv = el("button", "CSV"), image = el("button", "SVG");
  csv.type = image.type = "button";
  csv.className = "download-csv";
  image.className = "download-svg";
  const base = `${selected}-${chart.name}`;
  csv.addEventListener("click", () => download(`${base}.csv`, "text/csv",
    `${chart.x_title},${chart.name}\n` + chart.points.map((q) => `${q[0]},${q[1]}`).join("\n") + "\n"));
  image.addEventListener("click", () => download(`${base}.svg`, "image/svg+xml",
    new XMLSerializer().serializeToString(svg)));
  box.append(svg, csv, image);
  return box;
}

function drawCurves(charts) {
  const shown = charts.filter((c) => c.points.length > 0);
  $("no-curves").hidden = shown.length > 0;
  $("curves").replaceChildren(...shown.map(chartBox));
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
  if (selected !== null) drawJob(await api(`/api/jobs/${encodeURIComponent(selected)}`));
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
  const linked = jobFromHash();
  if (linked !== null) select(linked);
  window.addEventListener("hashchange", () => { const id = jobFromHash(); if (id !== null && id !== selected) select(id); });
  tick();
});
