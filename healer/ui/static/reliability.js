// The reliability tab (#42): the last 7 days as `healer report` computes them, from GET /api/reliability
// (the archive file when ui.archive_db is set, else the incident feed: docs/ui.md, "Reliability").
// Fetched when the tab opens and by its refresh button; drawn with DOM and SVG, nothing from elsewhere.
"use strict";
(function () {
  const R = { report: null, error: null, loads: 0 };
  const SVG = "http://www.w3.org/2000/svg";
  const COLOURS = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#9c755f"];
  const BUCKETS = [[300, "0-5m"], [900, "5m-15m"], [3600, "15m-1h"], [14400, "1h-4h"], [86400, "4h-1d"], [Infinity, ">1d"]];
  const $ = (id) => document.getElementById(id);
  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function svg(tag, attrs, text) {
    const e = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function dur(s) {
    if (s === null || s === undefined) return "–";
    if (s < 120) return `${Math.round(s)}s`;
    if (s < 7200) return `${Math.round(s / 60)}m`;
    if (s < 172800) return `${(s / 3600).toFixed(1)}h`;
    return `${(s / 86400).toFixed(1)}d`;
  }
  function table(headers, rows) {
    if (!rows.length) return el("p", "muted", "none");
    const t = el("table", "rel-table"), head = el("tr");
    for (const h of headers) head.append(el("th", "", h));
    t.append(head);
    for (const row of rows) { const tr = el("tr"); for (const c of row) tr.append(el("td", typeof c === "number" ? "n" : "", String(c))); t.append(tr); }
    return t;
  }
  function bars(title, labels, series, unit) {
    // series: [[name, [value per label]]], stacked; one bar per label
    const W = 560, H = 170, left = 44, bottom = 22, top = 8;
    const totals = labels.map((_, i) => series.reduce((a, [, v]) => a + v[i], 0));
    const max = Math.max(1e-9, ...totals);
    const g = svg("svg", { width: W, height: H + 18 * Math.ceil(series.length / 4), role: "img", "aria-label": title, class: "rel-plot" });
    const bw = (W - left - 8) / Math.max(1, labels.length);
    g.append(svg("text", { x: 2, y: top + 8, fill: "#8a94a0" }, `${max.toFixed(max < 10 ? 1 : 0)} ${unit}`));
    g.append(svg("line", { x1: left, x2: W - 4, y1: H - bottom, y2: H - bottom, stroke: "#2a3038" }));
    labels.forEach((label, i) => {
      let y = H - bottom;
      series.forEach(([, v], k) => {
        const h = (v[i] / max) * (H - bottom - top);
        if (h > 0) { y -= h; g.append(svg("rect", { x: left + i * bw + 2, y, width: Math.max(1, bw - 4), height: h, fill: COLOURS[k % COLOURS.length] })); }
      });
      g.append(svg("text", { x: left + i * bw + bw / 2, y: H - 6, "text-anchor": "middle", fill: "#8a94a0" }, label));
    });
    if (series.length > 1) series.forEach(([name], k) => {
      const x = 4 + (k % 4) * 140, y = H + 14 + 18 * Math.floor(k / 4);
      g.append(svg("rect", { x, y: y - 9, width: 10, height: 10, fill: COLOURS[k % COLOURS.length] }), svg("text", { x: x + 14, y, fill: "#d8dde3" }, name));
    });
    const fig = el("figure", "rel-figure");
    fig.append(el("figcaption", "", title), g);
    return fig;
  }
  function render(r) {
    const box = $("rel-body");
    box.replaceChildren();
    const f = r.fleet, t = r.totals;
    const head = el("div", "rel-head");
    head.append(
      el("span", "rel-big", f.health_score === null ? "–" : f.health_score.toFixed(1)), el("span", "muted", "fleet health score"),
      el("span", "rel-big", f.availability === null ? "–" : `${(100 * f.availability).toFixed(3)} %`), el("span", "muted", "availability"),
      el("span", "rel-big", String(t.incidents)), el("span", "muted", "incidents"),
      el("span", "rel-big", t.gpu_hours_lost.toFixed(1)), el("span", "muted", "GPU-hours lost"));
    box.append(head);
    const when = new Date(r.computed_at * 1000).toISOString().slice(0, 16).replace("T", " ");
    const from = r.source === "archive" ? `the archive ${r.archive_db.split("/").pop()}` : "the incident feed (the page read it itself)";
    const about = el("p", "muted", `last 7 days, from ${from}, computed ${when} UTC · ${r.assumptions.fleet_gpus} GPUs (${r.assumptions.fleet_gpus_source})`);
    if (r.archive_db) about.title = r.archive_db;
    box.append(about);
    const days = Object.keys(r.gpu_hours_lost.by_day);
    const rules = [...new Set(days.flatMap((d) => Object.keys(r.gpu_hours_lost.by_day[d])))].sort();
    const plots = el("div", "rel-plots");
    plots.append(bars("GPU-hours lost per day, by rule", days.map((d) => d.slice(5)), rules.map((rule) => [rule, days.map((d) => r.gpu_hours_lost.by_day[d][rule] || 0)]), "GPU-h"));
    const counts = BUCKETS.map(() => 0);
    for (const s of r.repair_times_s) counts[BUCKETS.findIndex(([hi]) => s < hi)]++;
    plots.append(bars("repair times (open to resolved)", BUCKETS.map(([, l]) => l), [["repairs", counts]], "repairs"));
    box.append(plots);
    box.append(el("h3", "", "per rule and kind"), table(["rule", "kind", "incidents", "open", "escalated", "to contain p50", "repair p50", "repair p90", "ladder outcomes"],
      r.by_rule.map((b) => [b.rule_id, b.kind, b.incidents, b.open, b.escalated, dur(b.to_containment.p50_s), dur(b.to_resolution.p50_s), dur(b.to_resolution.p90_s),
        Object.entries(b.ladder_outcomes).map(([k, v]) => `${k} ${v}`).join(", ") || "–"])));
    box.append(el("h3", "", "repeat offenders (RMA candidates, 30 days)"), table(["node", "GPU", "incidents", "mean time between", "rules"],
      r.repeat_offenders.map((o) => [o.node, o.gpu_index === null ? "node" : o.gpu_index, o.incidents, dur(o.mean_time_between_s), o.rules.join(", ")])));
    box.append(el("h3", "", "precision from operators' verdicts"), table(["rule", "confirmed", "false alarms", "precision"],
      r.precision.map((p) => [p.rule_id, p.confirmed, p.false_alarms, `${Math.round(100 * p.precision)} %`])));
    if (r.precision_by_component.length) box.append(table(["anomaly component", "confirmed", "false alarms", "precision"],
      r.precision_by_component.map((p) => [p.component, p.confirmed, p.false_alarms, `${Math.round(100 * p.precision)} %`])));
    box.append(el("h3", "", "circuit breaker trips"), table(["incident", "opened"], r.breaker_trips.map((b) => [b.incident_id, new Date(b.opened_at * 1000).toISOString().slice(0, 16)])));
  }
  async function load() {
    $("rel-body").replaceChildren(el("p", "muted", "computing the last 7 days…"));
    try {
      const resp = await fetch("/api/reliability", { credentials: "same-origin" });
      const text = await resp.text();
      if (!resp.ok) { R.error = text.trim(); $("rel-body").replaceChildren(el("p", "stale", R.error)); return; }
      R.report = JSON.parse(text); R.error = null; R.loads++;
      render(R.report);
    } catch (e) { R.error = String(e); $("rel-body").replaceChildren(el("p", "stale", R.error)); }
  }
  function show(tab) {
    const rel = tab === "reliability";
    $("reliability").hidden = !rel;
    $("map-section").hidden = rel;
    $("tab-map").classList.toggle("on", !rel);
    $("tab-reliability").classList.toggle("on", rel);
    if (rel && !R.report) load();
  }
  document.addEventListener("DOMContentLoaded", () => {
    $("tab-map").addEventListener("click", () => show("map"));
    $("tab-reliability").addEventListener("click", () => show("reliability"));
    $("rel-refresh").addEventListener("click", load);
  });
  window.healerReliability = { state: R, load, show };
})();
