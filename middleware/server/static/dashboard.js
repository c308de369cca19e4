// kvgate dashboard: polls /v1/stats (points after the last one seen) and redraws with plotly.js.
"use strict";

const state = { since: null, points: [], meta: null, timer: null };
const OUTCOMES = [["exact", "exact hit", "#1a7f37"], ["semantic", "semantic hit", "#5cb85c"],
                  ["miss", "miss", "#f0ad4e"], ["error", "error", "#c62828"]];
const CONFIG = { displayModeBar: false, responsive: true };
const $ = (id) => document.getElementById(id);
const sum = (xs) => xs.reduce((a, b) => a + b, 0);

function layout(title, extra) {
  return Object.assign({ title: { text: title, font: { size: 14 } }, margin: { l: 50, r: 15, t: 35, b: 35 },
    legend: { orientation: "h", y: -0.2 }, xaxis: { type: "date", tickangle: 0, nticks: 6 } }, extra || {});
}

function draw(id, title, traces, extra) {
  const empty = !traces.some((t) => t.y.some((v) => v != null));
  const more = empty ? { annotations: [{ text: "no data", showarrow: false, xref: "paper", yref: "paper", x: 0.5, y: 0.5 }],
    yaxis: { visible: false } } : {};
  Plotly.react($(id), traces, layout(title, Object.assign({}, extra, more)), CONFIG);
}

function line(name, x, y, more) {
  return Object.assign({ type: "scatter", mode: "lines+markers", name: name, x: x, y: y, marker: { size: 4 } }, more || {});
}

function perRoute(point, field) {
  return sum(Object.values(point.routes).map((r) => r[field] || 0));
}

function selectedRoute() {
  return $("route").value || (state.meta && state.meta.routes[0]);
}

function fillRoutes(routes) {
  const select = $("route");
  if (select.options.length === routes.length) return;
  select.replaceChildren(...routes.map((r) => { const o = document.createElement("option"); o.textContent = r; return o; }));
  select.onchange = render;
}

function renderCounters(totals) {
  const all = (f) => sum(Object.values(totals).map((t) => t[f] || 0));
  const hits = all("exact") + all("semantic"), misses = all("miss");
  $("hits").textContent = hits;
  $("misses").textContent = misses;
  $("errors").textContent = all("error");
  $("hit-ratio").textContent = hits + misses ? (100 * hits / (hits + misses)).toFixed(1) + " %" : "–";
  $("tokens-saved").textContent = all("tokens_saved");
  $("cost-saved").textContent = all("cost_saved").toFixed(4);
}

function renderTraffic(x, pts, routes) {
  draw("c-requests", "Requests per interval, by outcome (all routes)", OUTCOMES.map(([f, name, color]) =>
    ({ type: "bar", name: name, x: x, y: pts.map((p) => perRoute(p, f)), marker: { color: color } })), { barmode: "stack" });
  const cum = (f) => pts.map((p) => sum(Object.values(p.routes).map((r) => r.cum[f] || 0)));
  const exact = cum("exact"), semantic = cum("semantic");
  const hitsCum = exact.map((e, i) => e + semantic[i]);
  draw("c-cumulative", "Requests since start (all routes)", [
    line("hits", x, hitsCum, { line: { color: "#1a7f37" } }),
    line("misses", x, cum("miss"), { line: { color: "#f0ad4e" } }),
    line("errors", x, cum("error"), { line: { color: "#c62828" } })]);
  draw("c-ratio", "Hit ratio per interval, per route", routes.map((r) => line(r, x, pts.map((p) => {
    const v = p.routes[r]; const n = v.exact + v.semantic + v.miss;
    return n ? (v.exact + v.semantic) / n : null;
  }))), { yaxis: { range: [0, 1.05], tickformat: ".0%" } });
  draw("c-saved", "Saved by hits since start (all routes)", [
    line("tokens", x, pts.map((p) => sum(Object.values(p.routes).map((r) => r.cum.tokens_saved)))),
    line("USD", x, pts.map((p) => sum(Object.values(p.routes).map((r) => r.cum.cost_saved))), { yaxis: "y2" })],
    { yaxis: { rangemode: "tozero" }, yaxis2: { overlaying: "y", side: "right", title: "USD", rangemode: "tozero" } });
}

function renderLatency(x, pts, route) {
  const ms = (f) => pts.map((p) => (p.routes[route][f] == null ? null : 1000 * p.routes[route][f]));
  draw("c-latency", `Latency (ms), route ${route}`, [
    line("hit p50", x, ms("hit_p50")), line("hit p99", x, ms("hit_p99")),
    line("miss p50", x, ms("miss_p50")), line("miss p99", x, ms("miss_p99"))]);
  draw("c-ttft", `Time to first token of streamed misses (ms), route ${route}`, [
    line("p50", x, ms("ttft_p50")), line("p99", x, ms("ttft_p99"))]);
}

// The replica table: each column's header next to what fills it, so the two cannot drift apart
// (the header row is drawn from this list). t(f): field f summed over the points shown; the
// engine's columns are what the replica's own /metrics said, "–" where its engine has no such number.
const dash = (v) => (v == null ? "–" : v);
const REPLICA_COLUMNS = [
  ["replica", (n) => n],
  ["state", (n, r) => (r.up ? "up" : "down")],
  ["in flight", (n, r) => r.in_flight],
  ["requests", (n, r, t) => t("requests")],
  ["marked down", (n, r, t) => t("marked_down")],
  ["prefix hit rate", (n, r, t) => (t("prompt_tokens") ? (100 * t("cached_tokens") / t("prompt_tokens")).toFixed(1) + " %" : "–")],
  ["prompt tokens", (n, r, t, read) => (read ? t("prompt_tokens") : "–")],
  ["cached tokens", (n, r, t, read) => (read ? t("cached_tokens") : "–")],
  ["running", (n, r) => dash(r.running)],
  ["waiting", (n, r) => dash(r.waiting)],
  ["engine", (n, r) => dash(r.engine)],
];

function renderReplicas(x, pts, names) {
  $("replicas").hidden = names.length === 0;
  if (!names.length) return;
  const last = pts[pts.length - 1].replicas;
  const head = $("replica-rows").parentElement.tHead.rows[0];
  if (head.cells.length !== REPLICA_COLUMNS.length) {
    head.replaceChildren(...REPLICA_COLUMNS.map(([h]) => { const th = document.createElement("th"); th.textContent = h; return th; }));
  }
  $("replica-rows").replaceChildren(...names.map((n) => {
    const row = document.createElement("tr"), r = last[n];
    const t = (f) => sum(pts.map((p) => p.replicas[n][f] || 0));
    const read = pts.some((p) => p.replicas[n].engine);  // some point recognised the replica's engine
    REPLICA_COLUMNS.forEach(([, cell], i) => { const td = document.createElement("td"); td.textContent = cell(n, r, t, read);
      if (i === 1) td.className = r.up ? "up" : "down"; row.appendChild(td); });
    return row;
  }));
  const series = (f) => names.map((n) => line(n, x, pts.map((p) => p.replicas[n][f])));
  draw("c-rep-requests", "Requests sent per interval", series("requests"));
  // the proxy's count beside the engine's own: a gap between them is time spent outside the engine
  const engine = (f, style) => names.filter((n) => pts.some((p) => p.replicas[n][f] != null)).map((n) =>
    line(`${n} ${f}`, x, pts.map((p) => p.replicas[n][f] ?? null), { line: { dash: style } }));
  draw("c-rep-inflight", "In flight (proxy); running, waiting (engine's /metrics)",
    [...series("in_flight"), ...engine("running", "dash"), ...engine("waiting", "dot")]);
  draw("c-rep-prefix", "Prefix hit rate (cached / prompt tokens, replica's /metrics)", names.map((n) =>
    line(n, x, pts.map((p) => { const r = p.replicas[n]; return r.prompt_tokens ? r.cached_tokens / r.prompt_tokens : null; }))),
    { yaxis: { range: [0, 1.05], tickformat: ".0%" } });
  const tiers = (f) => names.flatMap((n) => Object.keys(last[n][f] || {}).map((t) =>
    line(`${n} ${t}`, x, pts.map((p) => (p.replicas[n][f] || {})[t] ?? null))));
  draw("c-kv-bytes", "KV store bytes per tier", tiers("kv_bytes"));
  draw("c-kv-hits", "KV chunk hits per tier, per interval", tiers("kv_hits"));
  const routes = state.meta.routes;
  draw("c-failovers", "Failovers per interval (requests moved to another replica)", routes.map((r) =>
    ({ type: "bar", name: r, x: x, y: pts.map((p) => p.routes[r].failovers) })));
}

function renderFeedback(x, pts, routes, totals) {
  $("feedback-rows").replaceChildren(...routes.map((r) => {
    const t = totals[r], hits = t.exact + t.semantic, row = document.createElement("tr");
    [r, t.correct, t.wrong, hits, hits ? (t.wrong / hits).toFixed(3) : "–", t.explorations ?? 0,
      (t.wrong_estimate ?? 0).toFixed(2)].forEach((c) => {
      const td = document.createElement("td"); td.textContent = c; row.appendChild(td); });
    return row;
  }));
  draw("c-feedback", "Feedback verdicts per interval", routes.flatMap((r) => [
    { type: "bar", name: `${r} correct`, x: x, y: pts.map((p) => p.routes[r].correct) },
    { type: "bar", name: `${r} wrong`, x: x, y: pts.map((p) => p.routes[r].wrong) }]), { barmode: "stack" });
}

function render() {
  const meta = state.meta, pts = state.points;
  if (!meta) return;
  fillRoutes(meta.routes);
  renderCounters(meta.totals);
  if (!pts.length) return;
  const x = pts.map((p) => new Date(p.t * 1000));
  renderTraffic(x, pts, meta.routes);
  renderLatency(x, pts, selectedRoute());
  renderReplicas(x, pts, meta.replicas);
  renderFeedback(x, pts, meta.routes, meta.totals);
  $("status").textContent = `${pts.length} points, one per ${meta.interval_s} s; updated ${new Date().toLocaleTimeString()}`;
  document.body.dataset.points = pts.length;
}

async function poll() {
  try {
    const url = "/v1/stats" + (state.since == null ? "" : "?since=" + state.since);
    const response = await fetch(url, { headers: { accept: "application/json" }, credentials: "same-origin" });
    if (response.status === 401) {
      $("dashboard").hidden = true; $("login").style.display = "block"; $("status").textContent = "sign in needed";
      return;
    }
    const data = await response.json();
    state.meta = data;
    state.points = state.points.concat(data.points).slice(-data.keep);
    if (state.points.length) state.since = state.points[state.points.length - 1].t;
    render();
    if (!state.timer) state.timer = setInterval(poll, Math.max(500, 1000 * data.interval_s));
  } catch (err) {
    $("status").textContent = "stats unavailable: " + err;
  }
}

poll();
