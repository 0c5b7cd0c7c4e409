// The status page: a fleet map drawn on one canvas, incidents, safety and the feed, kept live by
// server-sent events (/api/events: a snapshot first, then changes). It only ever GETs; an operator's
// verdict is verdicts.js's one POST.
"use strict";
(function () {
  const HEALTH = [
    ["ok", "#2e9e5b"], ["info", "#4f8fc9"], ["warning", "#e0b92f"], ["major", "#ef8a2b"],
    ["critical", "#e03c3c"], ["GPU missing", "#a24fd0"], ["node silent", "#5a6068"], ["no GPU", "#1d2127"],
  ];
  const SEV = { info: 1, warning: 2, major: 3, critical: 4 };
  const NO_TEMP = 255;
  const S = { nodes: [], groups: [], gpus: 8, temp: new Uint8Array(0), health: new Uint8Array(0),
    incidents: new Map(), excluded: new Set(), marks: {}, layout: null, cell: 8, mode: "health", anomaly: new Map(),
    selected: null, renderMs: null, snapshots: 0, cellsMsgs: 0, bytes: 0, links: {}, staleAfter: 30 };
  // A node's frame on the map: healer holds it cordoned or drained, or an operator excluded it.
  const MARK = { drained: "#f06fd8", cordoned: "#36c5d6", excluded: "#c8ced6" };
  const SELECTED = "#ffffff";
  const DOMAIN = "#ff9f1c";  // a shared-cause domain incident's outline over its member nodes (#27)
  const $ = (id) => document.getElementById(id);
  const canvas = $("map"), ctx = canvas.getContext("2d");

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }
  function b64(s) {
    const bin = atob(s), out = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) out[i] = bin.charCodeAt(i);
    return out;
  }
  function ago(t) {
    const s = Math.max(0, Date.now() / 1000 - t);
    if (s < 90) return `${Math.round(s)}s ago`;
    if (s < 5400) return `${Math.round(s / 60)}m ago`;
    return `${(s / 3600).toFixed(1)}h ago`;
  }
  function hhmmss(t) { return new Date(t * 1000).toISOString().slice(11, 19); }
  function age(seconds) {
    if (seconds === null || seconds === undefined) return "never";
    if (seconds < 90) return `${Math.round(seconds)} s`;
    if (seconds < 5400) return `${Math.round(seconds / 60)} min`;
    if (seconds < 172800) return `${(seconds / 3600).toFixed(1)} h`;
    return `${Math.round(seconds / 86400)} days`;
  }
  function short(text, n) { const t = String(text ?? ""); return t.length > n ? `${t.slice(0, n - 1)}…` : t; }
  function num(v, digits) { return v === null || v === undefined || !Number.isFinite(Number(v)) ? "–" : Number(v).toFixed(digits ?? 0); }
  function score(v) { return v === null || v === undefined || !Number.isFinite(Number(v)) ? "no score" : Number(v).toFixed(3); }
  function link(href, text) {
    const a = el("a", "ext", text);
    a.href = href; a.target = "_blank"; a.rel = "noopener noreferrer";
    return a;
  }
  function nodeButton(node, gpu) {
    const b = el("button", "node-link", gpu === null || gpu === undefined ? node : `${node}/gpu${gpu}`);
    b.type = "button";
    b.addEventListener("click", (ev) => { ev.stopPropagation(); showNode(node, gpu ?? null); });
    return b;
  }
  function where(node, gpu, port) {
    if (port) return `${node} port ${port}`;
    return gpu === null || gpu === undefined ? node : `${node}/gpu${gpu}`;
  }

  // --- colours ---------------------------------------------------------------------------------------
  function ramp(f) { // 0..1 -> blue .. green .. yellow .. red
    const stops = [[40, 90, 200], [46, 158, 91], [224, 185, 47], [224, 60, 60]];
    const p = Math.min(0.999, Math.max(0, f)) * (stops.length - 1), i = Math.floor(p), r = p - i;
    const c = stops[i].map((a, k) => Math.round(a + (stops[i + 1][k] - a) * r));
    return `rgb(${c[0]},${c[1]},${c[2]})`;
  }
  const TEMP_PALETTE = Array.from({ length: 256 }, (_, t) => (t === NO_TEMP ? "#30353c" : ramp((t - 25) / 70)));
  function colour(i) {
    const h = S.health[i];
    if (h >= 5) return HEALTH[h][1];
    if (S.mode === "health") return HEALTH[h][1];
    if (S.mode === "temp") return TEMP_PALETTE[S.temp[i]];
    const node = S.nodes[Math.floor(i / S.gpus)], score = S.anomaly.get(`${node}/${i % S.gpus}`) ?? S.anomaly.get(node);
    return score === undefined ? "#30353c" : ramp(score);
  }
  function legend() {
    const box = $("legend");
    box.replaceChildren();
    const items = S.mode === "health" ? HEALTH.slice(0, 7)
      : S.mode === "anomaly" ? [["0", ramp(0)], ["0.5", ramp(0.5)], ["1", ramp(1)], ["no score", "#30353c"]]
      : [["30 °C", ramp(5 / 70)], ["60 °C", ramp(35 / 70)], ["90 °C", ramp(65 / 70)]];
    for (const [name, c] of items) { const s = el("span", "", name); s.style.setProperty("--c", c); box.append(s); }
    if (S.mode === "anomaly") box.append(el("span", "muted", "anomaly scores are not published by the controller: only incidents' evidence is shown"));
    const present = new Set(Object.values(S.marks).flat());
    for (const m of ["cordoned", "drained", "excluded"]) {
      if (!present.has(m)) continue;
      const s = el("span", "mark", `${m} (frame)`); s.style.setProperty("--c", MARK[m]); box.append(s);
    }
    if (domainIncidents().length) {
      const s = el("span", "mark", "suspected domain (dashed outline)"); s.style.setProperty("--c", DOMAIN); box.append(s);
    }
  }
  function domainIncidents() {
    return [...S.incidents.values()].filter((i) => i.domain && i.state !== "resolved");
  }
  function domainsOf(node) {
    return domainIncidents().filter((i) => i.domain.members.includes(node));
  }

  // --- layout and drawing ----------------------------------------------------------------------------
  function computeLayout() {
    const n = S.nodes.length, g = S.gpus;
    S.cell = n <= 64 ? 16 : n <= 400 ? 10 : n <= 2500 ? 6 : 4;
    const c = S.cell, gap = c >= 8 ? 2 : 1;
    const cols = Math.min(g, 4), rows = Math.ceil(g / cols);
    const tileW = cols * c + (cols - 1) * (gap > 1 ? 1 : 0) + gap * 2 + 2, tileH = rows * c + (rows - 1) * (gap > 1 ? 1 : 0) + gap * 2 + 2;
    const width = Math.max(300, $("map-wrap").clientWidth);
    const perRow = Math.max(1, Math.floor((width - 8) / tileW));
    // One group: the whole width. Many (racks): near-square blocks packed in shelves, left to right.
    const head = 18, space = 12, margin = 4, blocks = [];
    let x = margin, y = 0, shelf = 0;
    for (const [name, members] of S.groups) {
      let cols = perRow;
      if (S.groups.length > 1) {
        cols = Math.ceil(Math.sqrt((members.length * tileH) / tileW));
        cols = Math.min(perRow, Math.max(cols, Math.ceil(130 / tileW), 1));
      }
      const lines = Math.ceil(members.length / cols), w = cols * tileW, h = head + lines * tileH;
      if (x > margin && x + w > width) { x = margin; y += shelf + 6; shelf = 0; }
      blocks.push({ name, members, x, y, top: y + head, cols, lines });
      x += w + space; shelf = Math.max(shelf, h);
    }
    y += shelf + 6;
    S.layout = { c, gap, cols, rows, tileW, tileH, perRow, blocks, width, height: Math.max(y, 40), inner: c >= 8 ? 1 : 0 };
    const dpr = window.devicePixelRatio || 1;
    canvas.width = Math.round(width * dpr); canvas.height = Math.round(S.layout.height * dpr);
    canvas.style.width = `${width}px`; canvas.style.height = `${S.layout.height}px`;
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    S.pos = new Int32Array(n * 2).fill(-1);
    for (const b of blocks) b.members.forEach((row, k) => {
      S.pos[row * 2] = b.x + (k % b.cols) * tileW; S.pos[row * 2 + 1] = b.top + Math.floor(k / b.cols) * tileH;
    });
  }
  function cellRect(i) {
    const L = S.layout, row = Math.floor(i / S.gpus), g = i % S.gpus;
    const x0 = S.pos[row * 2], y0 = S.pos[row * 2 + 1];
    if (x0 < 0) return null;
    return [x0 + 1 + L.gap + (g % L.cols) * (L.c + L.inner), y0 + 1 + L.gap + Math.floor(g / L.cols) * (L.c + L.inner), L.c, L.c];
  }
  function drawCell(i) {
    const r = cellRect(i);
    if (!r) return;
    ctx.fillStyle = colour(i);
    ctx.fillRect(r[0], r[1], r[2], r[3]);
  }
  function frameColour(node) {
    if (S.selected && S.selected[0] === node) return SELECTED;
    const m = S.marks[node];
    if (!m || !m.length) return null;
    return MARK[m.includes("drained") ? "drained" : m.includes("cordoned") ? "cordoned" : "excluded"];
  }
  function drawTileFrame(row) {
    const L = S.layout, x = S.pos[row * 2], y = S.pos[row * 2 + 1];
    if (x < 0) return;
    const marked = frameColour(S.nodes[row]);
    if (!marked && L.c < 6) return;
    ctx.fillStyle = marked || "#20252c";
    ctx.fillRect(x + 0.5, y + 0.5, L.tileW - 2, L.tileH - 2);
    ctx.fillStyle = "#111418";
    const w = marked && L.c >= 6 ? 2 : 1;
    ctx.fillRect(x + 0.5 + w, y + 0.5 + w, L.tileW - 2 - 2 * w, L.tileH - 2 - 2 * w);
  }
  function drawAll() {
    const t0 = performance.now();
    computeLayout();
    const L = S.layout;
    ctx.clearRect(0, 0, L.width, L.height);
    ctx.font = "11px system-ui, sans-serif"; ctx.textBaseline = "top";
    for (const b of L.blocks) {
      ctx.fillStyle = "#8a94a0";
      ctx.fillText(`${b.name}  (${b.members.length})`, b.x, b.y + 2);
    }
    for (let row = 0; row < S.nodes.length; row++) drawTileFrame(row);
    // One fillStyle per colour: 80,000 cells in a few passes instead of 80,000 style changes.
    const byColour = new Map();
    for (let i = 0; i < S.health.length; i++) {
      const c = colour(i);
      let list = byColour.get(c);
      if (!list) byColour.set(c, (list = []));
      list.push(i);
    }
    for (const [c, list] of byColour) {
      ctx.fillStyle = c;
      for (const i of list) { const r = cellRect(i); if (r) ctx.fillRect(r[0], r[1], r[2], r[3]); }
    }
    drawDomains();
    S.renderMs = performance.now() - t0;
    legend();
  }

  // A shared-cause domain incident drawn over its members: in each block that holds some of them, a
  // dashed outline around those tiles; a block that is the domain itself gets its header in that colour.
  function drawDomains() {
    const L = S.layout, row = new Map(S.nodes.map((n, r) => [n, r]));
    S.domainBoxes = [];
    for (const inc of domainIncidents()) {
      const members = new Set(inc.domain.members.filter((n) => row.has(n)).map((n) => row.get(n)));
      const named = `${inc.domain.key}=${inc.domain.value}`;
      for (const b of L.blocks) {
        const rows = b.members.filter((r) => members.has(r));
        if (!rows.length) continue;
        let x0 = Infinity, y0 = Infinity, x1 = -Infinity, y1 = -Infinity;
        for (const r of rows) {
          const x = S.pos[r * 2], y = S.pos[r * 2 + 1];
          x0 = Math.min(x0, x); y0 = Math.min(y0, y); x1 = Math.max(x1, x + L.tileW - 2); y1 = Math.max(y1, y + L.tileH - 2);
        }
        const box = { id: inc.id, block: b.name, x: x0 - 2.5, y: y0 - 2.5, w: x1 - x0 + 5, h: y1 - y0 + 5, nodes: rows.map((r) => S.nodes[r]) };
        ctx.strokeStyle = DOMAIN; ctx.lineWidth = 2; ctx.setLineDash([5, 3]);
        ctx.strokeRect(box.x, box.y, box.w, box.h);
        ctx.setLineDash([]);
        if (b.name === named) {  // the header only (not the outline), kept within the block's width
          const w = b.cols * L.tileW;
          ctx.clearRect(b.x, b.y, w, 14);
          ctx.save(); ctx.beginPath(); ctx.rect(b.x, b.y, w, 14); ctx.clip();
          ctx.fillStyle = DOMAIN;
          ctx.fillText(`${b.name}  (${b.members.length}) suspected`, b.x, b.y + 2);
          ctx.restore();
        }
        S.domainBoxes.push(box);
      }
    }
  }

  // --- side panels -----------------------------------------------------------------------------------
  function renderSafety(safety) {
    S.safety = safety;
    const b = safety.breaker, box = $("breaker");
    box.replaceChildren();
    if (b.open) box.append(el("div", "breaker-open", `CIRCUIT BREAKER OPEN since ${b.opened_at ? `${hhmmss(b.opened_at)} UTC` : "?"}: ${b.reason || ""} (healer breaker reset)`));
    else box.append(el("div", "breaker-closed", `breaker closed · ${b.in_window} node(s) in its window${b.reset_by ? ` · last reset by ${b.reset_by} ${b.reset_at ? ago(b.reset_at) : ""}` : ""}`));
    if (b.nodes && b.nodes.length) {
      const list = el("div", "node-list");
      list.append(el("span", "muted", "in the window: "));
      for (const n of b.nodes.slice(0, 60)) list.append(nodeButton(n, null));
      if (b.nodes.length > 60) list.append(el("span", "muted", ` … and ${b.nodes.length - 60} more`));
      box.append(list);
    }
    const pw = $("power");
    pw.replaceChildren();
    for (const p of safety.power || []) { // power budgets (#30): live draw, what healer holds down, a shed
      const shed = p.shed_to_w !== null && p.shed_to_w !== undefined && p.shed_until && p.shed_until * 1000 > Date.now();
      const live = p.draw_w !== null && p.draw_w !== undefined && p.budget_in_force_w;
      if (!p.capped_gpus && !shed && !live) continue;
      let head = `power ${p.domain}:`;
      const body = [];
      if (live) { // the leader's last step, from the budget's KV state
        const inForce = p.budget_w && p.budget_in_force_w < p.budget_w ? ` in force (its budget ${num(p.budget_w / 1000, 1)} kW)` : "";
        head += ` ${num(p.draw_w / 1000, 1)} kW of ${num(p.budget_in_force_w / 1000, 1)} kW${inForce}, ${p.phase ?? "–"}`;
        body.push(head);
        if (p.capped_gpus) body.push(`${p.capped_gpus} GPU(s) capped to its budget`);
      } else {
        body.push(`${head} ${p.capped_gpus} GPU(s) capped to its budget`);
      }
      if (shed) body.push(`demand response: ${num(p.shed_to_w / 1000, 1)} kW for its GPUs until ${hhmmss(p.shed_until)} UTC`);
      if (live && p.at) body.push(`as of ${hhmmss(p.at)} UTC`);
      const row = el("div", p.capped_gpus || shed || p.phase === "over" ? "power-capped" : "power-under", body.join(" · "));
      row.dataset.domain = p.domain;
      pw.append(row);
    }
    const ex = $("exclusions");
    ex.replaceChildren();
    S.excluded = new Set(safety.exclusions.map((e) => e.node));
    if (safety.exclusions.length) {
      ex.append(el("div", "muted", `excluded (maintenance, no actions): ${safety.exclusions.length}`));
      for (const e of safety.exclusions.slice(0, 50)) {
        const row = el("div", "exclusion");
        row.append(nodeButton(e.node, null), el("span", "", ` ${e.reason || ""} (${e.by || "?"}${e.at ? `, ${ago(e.at)}` : ""})`));
        ex.append(row);
      }
    } else ex.append(el("div", "muted", "no nodes excluded"));
    const rr = $("rules"), r = safety.rules_rejected;
    rr.replaceChildren();
    if (r) {
      const boxr = el("div", "rules-rejected");
      boxr.append(el("div", "", `RULE RELOAD REJECTED ${ago(r.time)}: ${r.errors ?? "?"} error(s) in ${r.dir || "the rules"}; the previous rules${r.kept_rules ? ` (${r.kept_rules})` : ""} stay active`));
      for (const line of r.problems || []) boxr.append(el("div", "problem", line));
      rr.append(boxr);
    }
  }
  function renderIncidents() {
    const list = $("incidents"), items = [...S.incidents.values()];
    items.sort((a, b) => (SEV[b.severity] - SEV[a.severity]) || (b.opened - a.opened));
    $("inc-count").textContent = `(${items.length})`;
    const open = new Set([...list.querySelectorAll("li.open")].map((li) => li.dataset.id));
    list.replaceChildren();
    S.anomaly = new Map();
    for (const inc of items) {
      if ("anomaly_score" in inc.evidence) S.anomaly.set(inc.gpu === null ? inc.node : `${inc.node}/${inc.gpu}`, Number(inc.evidence.anomaly_score));
    }
    for (const inc of items.slice(0, 300)) {
      const li = el("li", `incident sev-${inc.severity}${open.has(inc.id) ? " open" : ""}`);
      li.dataset.id = inc.id; li.dataset.node = inc.node; li.dataset.gpu = inc.gpu === null ? "" : inc.gpu;
      const top = el("div", "top");
      top.append(el("span", "sev", inc.severity), el("span", "where", where(inc.node, inc.gpu, inc.port)), el("span", "rule", inc.rule),
        el("span", "muted", `${inc.state === "escalated" ? "ESCALATED · " : ""}${ago(inc.opened)}${inc.mode !== "enforce" ? ` · ${inc.mode}` : ""}`));
      li.append(top, el("div", "summary", short(inc.summary, 240)));
      if (inc.domain) {
        li.classList.add("domain");
        const m = el("div", "members");
        m.append(el("span", "muted", `${inc.domain.suspected} · ${inc.domain.member_count} of ${inc.domain.size} nodes: `));
        for (const n of inc.domain.members.slice(0, 40)) m.append(nodeButton(n, null));
        if (inc.domain.member_count > 40) m.append(el("span", "muted", ` … and ${inc.domain.member_count - 40} more`));
        li.append(m);
      }
      const chips = el("div");
      for (const a of inc.actions) chips.append(el("span", `chip ${a.status}`, `${a.kind}: ${a.status}`));
      li.append(chips);
      if (open.has(inc.id)) li.append(details(inc));
      li.addEventListener("click", () => {
        li.classList.toggle("open");
        if (li.classList.contains("open")) li.append(details(inc)); else li.querySelector(".details")?.remove();
        if (S.nodes.includes(inc.node)) showNode(inc.node, inc.gpu);  // not the fleet-wide breaker incident
      });
      list.append(li);
    }
    if (items.length > 300) list.append(el("li", "muted", `… and ${items.length - 300} more`));
  }
  function evidenceValue(key, v) {
    const td = el("td");
    if (Array.isArray(v)) {
      const nodesList = /node/.test(key) && v.every((x) => typeof x === "string");
      if (nodesList) for (const n of v.slice(0, 100)) td.append(nodeButton(n, null));
      else td.textContent = short(v.map((x) => (typeof x === "object" ? JSON.stringify(x) : String(x))).join(", "), 300);
      if (v.length > 100) td.append(el("span", "muted", ` … and ${v.length - 100} more`));
    } else if (v !== null && typeof v === "object") td.textContent = short(JSON.stringify(v), 300);
    else if (/node/.test(key) && typeof v === "string" && /^[A-Za-z0-9._-]+([,\s]+[A-Za-z0-9._-]+)*$/.test(v.trim())) {
      // a node list (the breaker's evidence: the nodes it counted), as buttons to each node's view
      const names = v.trim().split(/[,\s]+/);
      for (const n of names.slice(0, 100)) td.append(nodeButton(n, null));
      if (names.length > 100) td.append(el("span", "muted", ` … and ${names.length - 100} more`));
    } else td.textContent = short(v, 300);
    return td;
  }
  function details(inc) {
    const box = el("div", "details");
    const ev = el("table");
    for (const [k, v] of Object.entries(inc.evidence)) { const tr = el("tr"); tr.append(el("td", "muted", k), evidenceValue(k, v)); ev.append(tr); }
    if (!Object.keys(inc.evidence).length) { const tr = el("tr"); tr.append(el("td", "muted", "no evidence recorded")); ev.append(tr); }
    box.append(el("div", "muted", "evidence"), ev, el("div", "muted", "timeline"));
    // Short lines: the summary is shown once above; a step repeats it only when it changed.
    const tl = el("table");
    const rows = [];
    let last = inc.timeline.length ? null : inc.summary;
    for (const t of inc.timeline) {
      const text = t.summary !== last ? short(t.summary, 90) : "";
      last = t.summary;
      rows.push([t.time, t.change, text, t.summary]);
    }
    for (const a of inc.actions) rows.push([a.at, `${a.kind}: ${a.status}`, short(a.detail, 90), a.detail]);
    rows.sort((a, b) => a[0] - b[0]);
    for (const [t, what, text, full] of rows) {
      const tr = el("tr"); const td = el("td", "", text);
      if (full && full !== text) td.title = full;
      tr.append(el("td", "muted", hhmmss(t)), el("td", "", what), td); tl.append(tr);
    }
    box.append(tl);
    const actions = el("div", "links");
    if (S.nodes.includes(inc.node)) actions.append(nodeButton(inc.node, inc.gpu));
    if (S.links.grafana && S.nodes.includes(inc.node)) actions.append(link(grafanaUrl(inc.node, inc.gpu), "Grafana ↗"));
    box.append(actions);
    if (window.healerVerdicts) box.append(window.healerVerdicts.box(inc.id));
    return box;
  }
  function grafanaUrl(node, gpu) {
    return S.links.grafana.replaceAll("{node}", encodeURIComponent(node)).replaceAll("{gpu}", gpu === null || gpu === undefined ? "" : String(gpu));
  }
  function addFeed(line, front) {
    const list = $("feed");
    const li = el("li", `sev-${line.severity}`);
    li.append(el("span", "muted", `${hhmmss(line.time)} `), el("span", "change", line.change), el("span", "", ` ${line.node ? where(line.node, line.gpu, line.port) : ""} ${line.rule} `), el("span", "muted", short(line.summary, 120)));
    li.title = line.summary;
    if (front) list.prepend(li); else list.append(li);
    while (list.children.length > 100) list.lastChild.remove();
  }
  function counts(frames) {
    const n = S.nodes.length;
    let bad = 0;
    for (let i = 0; i < S.health.length; i++) if (S.health[i] > 0 && S.health[i] < 7) bad++;
    $("counts").textContent = `${n} nodes · ${n * S.gpus} GPU slots · ${bad} need attention · ${S.incidents.size} open incidents · ${frames} frames`;
  }

  // --- the per-node view ----------------------------------------------------------------------------
  async function getJson(url) {
    const r = await fetch(url, { credentials: "same-origin" });
    return r.ok ? r.json() : null;
  }
  async function showNode(node, gpu) {
    const pick = gpu === null || gpu === undefined ? (S.selected && S.selected[0] === node ? S.selected[1] : 0) : gpu;
    const again = S.selected && S.selected[0] === node;
    S.selected = [node, pick];
    if (!again && S.layout) drawAll();
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

  function hit(ev) {
    const L = S.layout;
    if (!L) return null;
    const rect = canvas.getBoundingClientRect(), x = ev.clientX - rect.left, y = ev.clientY - rect.top;
    for (const b of L.blocks) {
      if (y < b.top || y >= b.top + b.lines * L.tileH || x < b.x || x >= b.x + b.cols * L.tileW) continue;
      const k = Math.floor((y - b.top) / L.tileH) * b.cols + Math.floor((x - b.x) / L.tileW);
      if (k >= b.members.length) return null;
      const row = b.members[k];
      const cx = x - S.pos[row * 2] - 1 - L.gap, cy = y - S.pos[row * 2 + 1] - 1 - L.gap;
      const g = Math.floor(cy / (L.c + L.inner)) * L.cols + Math.floor(cx / (L.c + L.inner));
      if (cx < 0 || cy < 0 || g < 0 || g >= S.gpus || Math.floor(cx / (L.c + L.inner)) >= L.cols) return null;
      return [row, g];
    }
    return null;
  }
  canvas.addEventListener("click", (ev) => { const h = hit(ev); if (h) showNode(S.nodes[h[0]], h[1]); });
  canvas.addEventListener("mousemove", (ev) => {
    const h = hit(ev), tip = $("tip");
    if (!h) { tip.hidden = true; return; }
    const i = h[0] * S.gpus + h[1], t = S.temp[i], marks = S.marks[S.nodes[h[0]]];
    const doms = domainsOf(S.nodes[h[0]]).map((d) => `${d.domain.suspected} suspected (${d.rule})`);
    tip.textContent = `${S.nodes[h[0]]} / GPU ${h[1]}\n${HEALTH[S.health[i]][0]} · ${t === NO_TEMP ? "–" : `${t} °C`}${marks && marks.length ? `\n${marks.join(", ")}` : ""}${doms.length ? `\n${doms.join("\n")}` : ""}`;
    const wrap = $("map-section").getBoundingClientRect();
    tip.style.left = `${ev.clientX - wrap.left + 12}px`; tip.style.top = `${ev.clientY - wrap.top + 12}px`;
    tip.hidden = false;
  });
  canvas.addEventListener("mouseleave", () => { $("tip").hidden = true; });
  $("gpu-close").addEventListener("click", () => { $("gpu-panel").hidden = true; S.selected = null; drawAll(); });
  $("mode").addEventListener("change", (ev) => { S.mode = ev.target.value; drawAll(); });
  let resizeTimer = null;
  window.addEventListener("resize", () => { clearTimeout(resizeTimer); resizeTimer = setTimeout(drawAll, 150); });

  // --- the live stream -------------------------------------------------------------------------------
  function onSnapshot(d) {
    S.snapshots++;
    $("title").textContent = d.title; document.title = `${d.title} status`;
    S.nodes = d.nodes; S.groups = d.groups; S.gpus = d.gpus;
    S.temp = b64(d.temp); S.health = b64(d.health);
    S.incidents = new Map(d.incidents.map((i) => [i.id, i]));
    window.healerVerdicts?.onSnapshot(d);
    S.marks = d.marks || {}; S.links = d.links || {}; S.staleAfter = d.stale_after_s;
    renderSafety(d.safety);
    renderIncidents();
    $("feed").replaceChildren();
    for (const line of d.recent.slice().reverse()) addFeed(line, false);
    drawAll();
    counts(d.frames);
    S.ready = true;
    S.readyAt = performance.now();
  }
  function onCells(d) {
    const t0 = performance.now();
    S.cellsMsgs++;
    for (let k = 0; k < d.i.length; k++) { S.temp[d.i[k]] = d.t[k]; S.health[d.i[k]] = d.h[k]; }
    if (d.marks) { S.marks = d.marks; drawAll(); } else if (S.layout) for (const i of d.i) drawCell(i);
    counts(d.frames);
    S.cellsMs = performance.now() - t0;
    if (S.selected && !$("gpu-panel").hidden) showNode(S.selected[0], S.selected[1]);
  }
  function onIncident(d) {
    if (d.state === "resolved" || d.timeline === undefined) S.incidents.delete(d.id); else S.incidents.set(d.id, d);
    renderIncidents();
    if (S.mode === "anomaly" || d.domain || S.domainBoxes?.some((b) => b.id === d.id)) drawAll();
  }
  function connect() {
    const es = new EventSource("/api/events");
    const on = (name, fn) => es.addEventListener(name, (m) => { S.bytes += m.data.length; fn(JSON.parse(m.data)); });
    es.onopen = () => { $("conn").textContent = "live"; $("conn").className = "conn up"; };
    es.onerror = () => { $("conn").textContent = "reconnecting"; $("conn").className = "conn down"; };
    on("snapshot", onSnapshot);
    on("cells", onCells);
    on("incident", onIncident);
    on("feed", (line) => addFeed(line, true));
    on("safety", (s) => { renderSafety(s); drawAll(); });
    on("verdict", (v) => window.healerVerdicts?.onVerdict(v));
  }

  // For tests and benchmarks: what is drawn, read back from the canvas itself.
  window.healerUi = {
    state: S,
    cellPixel(node, gpu) {
      const row = S.nodes.indexOf(node);
      if (row < 0) return null;
      const r = cellRect(row * S.gpus + gpu);
      if (!r) return null;
      const dpr = window.devicePixelRatio || 1;
      // Read through a 1x1 copy, so the map's own canvas never becomes a read-back canvas.
      const probe = document.createElement("canvas");
      probe.width = probe.height = 1;
      const pctx = probe.getContext("2d", { willReadFrequently: true });
      pctx.drawImage(canvas, Math.floor((r[0] + r[2] / 2) * dpr), Math.floor((r[1] + r[3] / 2) * dpr), 1, 1, 0, 0, 1, 1);
      const p = pctx.getImageData(0, 0, 1, 1).data;
      return `#${[p[0], p[1], p[2]].map((v) => v.toString(16).padStart(2, "0")).join("")}`;
    },
    cellCentre(node, gpu) {
      const row = S.nodes.indexOf(node), r = row < 0 ? null : cellRect(row * S.gpus + gpu);
      return r ? [r[0] + r[2] / 2, r[1] + r[3] / 2] : null;
    },
    healthColours: HEALTH.map((h) => h[1]),
    redraw() { drawAll(); return S.renderMs; },
    markColours: MARK,
    domainColour: DOMAIN,
    domainBoxes() { return S.domainBoxes || []; },
    pixelAt(x, y) {
      const dpr = window.devicePixelRatio || 1;
      const probe = document.createElement("canvas");
      probe.width = probe.height = 1;
      const pctx = probe.getContext("2d", { willReadFrequently: true });
      pctx.drawImage(canvas, Math.floor(x * dpr), Math.floor(y * dpr), 1, 1, 0, 0, 1, 1);
      const p = pctx.getImageData(0, 0, 1, 1).data;
      return `#${[p[0], p[1], p[2]].map((v) => v.toString(16).padStart(2, "0")).join("")}`;
    },
    framePixel(node) {
      const row = S.nodes.indexOf(node);
      if (row < 0 || S.pos[row * 2] < 0) return null;
      const dpr = window.devicePixelRatio || 1;
      const probe = document.createElement("canvas");
      probe.width = probe.height = 1;
      const pctx = probe.getContext("2d", { willReadFrequently: true });
      pctx.drawImage(canvas, Math.floor((S.pos[row * 2] + 1) * dpr), Math.floor((S.pos[row * 2 + 1] + S.layout.tileH / 2) * dpr), 1, 1, 0, 0, 1, 1);
      const p = pctx.getImageData(0, 0, 1, 1).data;
      return `#${[p[0], p[1], p[2]].map((v) => v.toString(16).padStart(2, "0")).join("")}`;
    },
  };
  connect();
})();
