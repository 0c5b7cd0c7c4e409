// The side panels: safety (rule reloads rejected, the circuit breaker, power budgets, exclusions), the
// open incidents with their evidence and timeline (an operator's verdict box from verdicts.js), the
// recent feed, and the counts in the header.
"use strict";
(function () {
  const P = window.healerPage;
  const { SEV, S, $, el, ago, hhmmss, short, num, link, nodeButton, where } = P;

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
        if (S.nodes.includes(inc.node)) P.showNode(inc.node, inc.gpu);  // not the fleet-wide breaker incident
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
  Object.assign(P, { renderSafety, renderIncidents, addFeed, counts });
})();
