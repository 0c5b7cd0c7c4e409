// The per-node view below the map: a node's facts, its GPUs, XID and incident history and RDMA ports,
// and one GPU's latest readings, charts (chart.js) and anomaly components; opened from the map, the
// incident list, any node button or the search box (node, node/GPU or GPU UUID).
"use strict";
(function () {
  const P = window.healerPage;
  const { MARK, S, $, el, ago, hhmmss, age, short, num, score, link, getJson } = P;

  async function showNode(node, gpu) {
    const pick = gpu === null || gpu === undefined ? (S.selected && S.selected[0] === node ? S.selected[1] : 0) : gpu;
    const again = S.selected && S.selected[0] === node;
    S.selected = [node, pick];
    if (!again && S.layout) P.drawAll();
    const [n, d] = await Promise.all([
      getJson(`/api/node?node=${encodeURIComponent(node)}`),
      getJson(`/api/gpu?node=${encodeURIComponent(node)}&gpu=${pick}`),
    ]);
    if (!S.selected || S.selected[0] !== node || S.selected[1] !== pick || !n) return;
    $("gpu-panel").hidden = false;
    renderNode(n, pick);
    if (d) renderGpu(d, n);
    else { $("gpu-title").textContent = `${node} · no GPU ${pick}`; $("gpu-latest").textContent = ""; }
    if (!again) $("gpu-panel").scrollIntoView({ block: "nearest" });
  }
  function renderNode(n, pick) {
    const facts = $("node-facts");
    facts.replaceChildren();
    const frame = n.seen_at === null ? "no frame received yet" : `last frame ${age(n.age_s)} ago`;
    facts.append(el("span", n.stale ? "stale" : "", n.stale ? `STALE · ${frame} (silent after ${n.stale_after_s} s)` : frame));
    for (const m of n.marks) { const s = el("span", `mark-chip ${m}`, m); s.style.setProperty("--c", MARK[m]); facts.append(s); }
    if (n.exclusion) facts.append(el("span", "muted", `excluded: ${n.exclusion.reason || ""} (${n.exclusion.by || "?"})`));
    facts.append(el("span", "", `driver ${n.driver ?? "–"} · VBIOS ${n.vbios ?? "–"}`));
    if (n.versions_note) facts.append(el("span", "muted", n.versions_note));
    const labels = Object.entries(n.labels).map(([k, v]) => `${k}=${v}`).join(" ");
    if (labels) facts.append(el("span", "muted", labels));
    const links = $("node-links");
    links.replaceChildren();
    if (n.grafana) links.append(link(n.grafana, "Grafana ↗"));
    const table = $("node-gpus");
    table.replaceChildren();
    const head = el("tr");
    for (const h of ["GPU", "state", "°C", "W", "limit W", "util %", "SM MHz", "incident", "UUID"]) head.append(el("th", "", h));
    table.append(head);
    for (const g of n.gpus) {
      const tr = el("tr", `gpu-row${g.gpu === pick ? " picked" : ""}`);
      tr.dataset.gpu = g.gpu;
      const L = g.latest;
      tr.append(el("td", "", g.gpu), el("td", g.state === "present" ? "" : "warn", g.state),
        el("td", "", num(L.temp_c)), el("td", "", num(L.power_w)), el("td", "", num(L.power_limit_w)),
        el("td", "", num(L.util_gpu_pct)), el("td", "", num(L.sm_clock_mhz)),
        el("td", g.severity ? `sev-${g.severity} sevtext` : "muted", g.severity || "–"), el("td", "muted", g.uuid ?? "–"));
      tr.addEventListener("click", () => showNode(n.node, g.gpu));
      table.append(tr);
    }
    if (!n.gpus.length) { const tr = el("tr"); tr.append(el("td", "muted", "no GPU reported yet")); table.append(tr); }
    const xids = $("node-xids");
    xids.replaceChildren();
    for (const x of n.xids.slice(0, 30)) xids.append(el("li", "", `${hhmmss(x.time)} ${x.kind}${x.xid !== null ? ` ${x.xid}` : ""}${x.gpu !== null ? ` gpu${x.gpu}` : ""} ${short(x.message, 70)}`));
    if (!n.xids.length) xids.append(el("li", "muted", "none in the page's window"));
    const hist = $("node-history");
    hist.replaceChildren();
    for (const i of n.incidents.slice(0, 30)) {
      const li = el("li", `sev-${i.severity}`);
      li.append(el("span", "muted", `${hhmmss(i.opened)} `), el("span", "sevtext", i.severity), el("span", "", ` ${i.rule}${i.gpu !== null ? ` gpu${i.gpu}` : ""}${i.port ? ` port ${i.port}` : ""} `),
        el("span", "muted", i.resolved ? `resolved ${ago(i.resolved)}` : i.state));
      li.title = i.summary;
      if (window.healerVerdicts) { window.healerVerdicts.remember(i.id, i.verdict); li.append(window.healerVerdicts.box(i.id, true)); }
      hist.append(li);
    }
    if (!n.incidents.length) hist.append(el("li", "muted", "none in the page's window"));
    const ports = $("node-ports");
    ports.replaceChildren();
    ports.hidden = !n.ports;
    if (n.ports && n.ports.length) {
      ports.append(el("h3", "", "RDMA ports (newest frame)"));
      for (const p of n.ports) {
        const up = p.state === 4;
        const errs = `link downed ${p.link_downed ?? "–"} · symbol ${p.symbol_error ?? "–"} · rcv errors ${p.port_rcv_errors ?? "–"}`;
        const carrier = p.carrier_changes === null || p.carrier_changes === undefined ? "" : ` · ${p.netdev} carrier changes ${p.carrier_changes}`;
        ports.append(el("div", up ? "" : "sev-major", `${p.device}/${p.port} ${p.link_layer ?? ""} ${up ? "ACTIVE" : `state ${p.state} phys ${p.phys_state}`} ${p.rate_gbps ?? "–"} Gb/s · ${errs}${carrier}`));
      }
    } else if (n.ports) ports.append(el("div", "muted", "no RDMA ports on this node"));
  }
  function renderGpu(d, n) {
    const [node, gpu] = [d.node, d.gpu];
    $("gpu-title").textContent = `${node} / GPU ${gpu}${d.model ? ` · ${d.model}` : ""}${d.excluded ? " · excluded" : ""}`;
    const L = d.latest;
    const state = d.stale ? `STALE: readings ${age(d.age_s)} old` : d.present ? "present" : "MISSING from its last frame";
    $("gpu-latest").textContent = `${num(L.temp_c)} °C (slowdown ${num(L.slowdown_temp_c)}) · ${num(L.power_w)} W of ${num(L.power_limit_w)} W · ${num(L.util_gpu_pct)} % · ${state} · uuid ${d.uuid ?? "–"}`;
    $("gpu-latest").className = d.stale ? "stale" : "";
    const now = Date.now() / 1000, gapS = Math.max(3 * d.step_s, 10);
    const common = { now, gapS, minSpan: 600 };
    const spans = [
      window.healerChart($("chart-temp"), d.ts, d.series.temp_c, { ...common, ref: L.slowdown_temp_c, color: "#ef8a2b" }),
      window.healerChart($("chart-power"), d.ts, d.series.power_w, { ...common, ref: L.power_limit_w, color: "#4f8fc9", min: 0 }),
      window.healerChart($("chart-util"), d.ts, d.series.util_gpu_pct, { ...common, color: "#2e9e5b", min: 0, max: 100 }),
      window.healerChart($("chart-clock"), d.ts, d.series.sm_clock_mhz, { ...common, color: "#a0a8b4", min: 0 }),
    ];
    S.chartSpan = spans[0].span;
    for (const r of document.querySelectorAll(".charts .range")) r.textContent = d.ts.length ? `· last ${age(now - d.ts[0])}` : "";
    const an = $("gpu-anomaly");
    an.replaceChildren();
    if (d.anomaly.available) {
      an.append(el("div", "muted", "anomaly components"));
      for (const [k, v] of Object.entries(d.anomaly.components)) an.append(el("div", "", `${k}: ${score(v)}`));
    } else {
      an.append(el("div", "muted", d.anomaly.note));
      for (const [id, v] of Object.entries(d.anomaly.incident_scores)) an.append(el("div", "", `anomaly_score ${score(v)} (incident ${id})`));
    }
    const inc = $("gpu-incidents");
    inc.replaceChildren();
    for (const i of d.incidents) inc.append(el("div", `sev-${i.severity}`, `${i.severity} ${i.rule}: ${short(i.summary, 160)}`));
    if (!d.incidents.length) inc.append(el("div", "muted", "no open incident on this GPU or its node"));
    for (const tr of document.querySelectorAll("#node-gpus tr.gpu-row")) tr.classList.toggle("picked", Number(tr.dataset.gpu) === gpu);
  }

  // --- search ----------------------------------------------------------------------------------------
  let searchTimer = null, searchHits = [];
  async function search(q) {
    const box = $("search-results");
    if (!q.trim()) { box.hidden = true; searchHits = []; return; }
    const hits = await getJson(`/api/search?q=${encodeURIComponent(q)}`) || [];
    if ($("search").value !== q) return;
    searchHits = hits;
    box.replaceChildren();
    for (const h of hits) {
      const li = el("li", "", h.gpu === null ? h.node : `${h.node} / GPU ${h.gpu}${h.uuid ? ` · ${h.uuid}` : ""}`);
      li.addEventListener("mousedown", (ev) => { ev.preventDefault(); pickHit(h); });
      box.append(li);
    }
    if (!hits.length) box.append(el("li", "muted", "no node or GPU matches"));
    box.hidden = false;
  }
  function pickHit(h) { $("search-results").hidden = true; showNode(h.node, h.gpu); }
  $("search").addEventListener("input", (ev) => { clearTimeout(searchTimer); const q = ev.target.value; searchTimer = setTimeout(() => search(q), 120); });
  $("search").addEventListener("keydown", async (ev) => {
    if (ev.key === "Escape") { $("search-results").hidden = true; return; }
    if (ev.key !== "Enter") return;
    clearTimeout(searchTimer);
    await search(ev.target.value);
    if (searchHits.length) pickHit(searchHits[0]);
  });
  $("search").addEventListener("blur", () => { setTimeout(() => { $("search-results").hidden = true; }, 100); });
  $("gpu-close").addEventListener("click", () => { $("gpu-panel").hidden = true; S.selected = null; P.drawAll(); });
  P.showNode = showNode;
})();
