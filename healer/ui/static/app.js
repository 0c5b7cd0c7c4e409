// The status page: a fleet map drawn on one canvas (map.js), incidents, safety and the feed (panels.js),
// a node's view (node_view.js), kept live by server-sent events (/api/events: a snapshot first, then
// changes), handled here. It only ever GETs; an operator's verdict is verdicts.js's one POST. page.js
// holds the state the parts share; index.html loads it first and this file last.
"use strict";
(function () {
  const P = window.healerPage;
  const { S, $, b64 } = P;
  const { renderSafety, renderIncidents, addFeed, counts, drawAll, drawCell, showNode } = P;

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

  connect();
})();
