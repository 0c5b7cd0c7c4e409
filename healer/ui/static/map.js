// The fleet map (#13): every GPU a cell on one canvas, tiles per node in blocks per group, coloured by
// health, temperature or anomaly evidence, with cordon/drain/exclusion frames and shared-cause domain
// outlines (#27). Hover shows a cell, a click opens the node's view (node_view.js). window.healerUi reads
// back what is drawn, for tests and benchmarks.
"use strict";
(function () {
  const P = window.healerPage;
  const { HEALTH, NO_TEMP, S, MARK, SELECTED, DOMAIN, $, el } = P;
  const canvas = $("map"), ctx = canvas.getContext("2d");

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
  canvas.addEventListener("click", (ev) => { const h = hit(ev); if (h) P.showNode(S.nodes[h[0]], h[1]); });
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
  $("mode").addEventListener("change", (ev) => { S.mode = ev.target.value; drawAll(); });
  let resizeTimer = null;
  window.addEventListener("resize", () => { clearTimeout(resizeTimer); resizeTimer = setTimeout(drawAll, 150); });

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
  Object.assign(P, { drawAll, drawCell });
})();
