// The status page's shared part (loaded first): its state (one object, S), colours and words every part
// uses, small DOM helpers and the one GET helper. The other parts (map.js, panels.js, node_view.js, app.js)
// read it from window.healerPage and add their own entry points to it, called once the page is running.
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
    b.addEventListener("click", (ev) => { ev.stopPropagation(); P.showNode(node, gpu ?? null); });
    return b;
  }
  function where(node, gpu, port) {
    if (port) return `${node} port ${port}`;
    return gpu === null || gpu === undefined ? node : `${node}/gpu${gpu}`;
  }
  async function getJson(url) {
    const r = await fetch(url, { credentials: "same-origin" });
    return r.ok ? r.json() : null;
  }

  const P = window.healerPage = {
    HEALTH, SEV, NO_TEMP, S, MARK, SELECTED, DOMAIN, $, el, b64, ago, hhmmss, age, short, num, score, link,
    nodeButton, where, getJson,
  };
})();
