// Operators' verdicts on the status page (#42): under an incident's details and beside each incident of
// a node's history, its latest verdict and, on a page with a token, two buttons (confirmed / false alarm)
// that POST /api/verdict: the same io.healer.incident.verdict.v1 event as `healer incidents verdict`.
// app.js calls window.healerVerdicts: box(id) to draw, onSnapshot / onVerdict to keep them current.
"use strict";
(function () {
  const V = { enabled: false, why: "asking the page…", latest: new Map(), sent: 0, errors: [] };
  const WHO = "healer.verdict.by";
  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  }
  function said(v) {
    if (!v) return "no verdict yet";
    const when = new Date(v.time * 1000).toISOString().slice(0, 16).replace("T", " ");
    return `${v.verdict === "confirmed" ? "confirmed" : "false alarm"} by ${v.by} (${when} UTC)${v.note ? `: ${v.note}` : ""}`;
  }
  function refresh(id) {
    for (const box of document.querySelectorAll(".verdict")) {
      if (box.dataset.incident === id) box.querySelector(".verdict-said").textContent = said(V.latest.get(id));
    }
  }
  async function send(id, verdict, box) {
    const who = (box.querySelector(".verdict-by")?.value ?? localStorage.getItem(WHO) ?? "").trim();
    const note = (box.querySelector(".verdict-note")?.value ?? "").trim();
    if (who) localStorage.setItem(WHO, who);
    const out = box.querySelector(".verdict-out");
    out.textContent = "sending…";
    try {
      const r = await fetch("/api/verdict", {
        method: "POST", credentials: "same-origin", headers: { "Content-Type": "application/json" },
        body: JSON.stringify({ incident_id: id, verdict, by: who || undefined, note: note || undefined }),
      });
      const text = await r.text();
      if (!r.ok) { out.textContent = text.trim(); V.errors.push(text.trim()); return; }
      const d = JSON.parse(text);
      V.sent++;
      out.textContent = `published as ${d.id}`;
      V.latest.set(id, { incident: id, verdict: d.verdict, by: d.by, note, time: Date.now() / 1000 });
      refresh(id);
    } catch (e) {
      out.textContent = `not sent: ${e}`;
      V.errors.push(String(e));
    }
  }
  // compact: no inputs (the node view is redrawn with every change, which would empty them); the name
  // given last in an incident's details is used.
  function box(id, compact) {
    const b = el("div", "verdict");
    b.dataset.incident = id;
    b.addEventListener("click", (ev) => ev.stopPropagation());  // not the incident's own toggle
    b.append(el("span", "muted", "verdict: "), el("span", "verdict-said", said(V.latest.get(id))));
    if (!V.enabled) { b.title = V.why || ""; return b; }
    const row = el("div", "verdict-row");
    if (!compact) {
      const who = el("input", "verdict-by"); who.placeholder = "your name"; who.value = localStorage.getItem(WHO) || ""; who.size = 10;
      const note = el("input", "verdict-note"); note.placeholder = "note (optional)"; note.size = 16;
      row.append(who, note);
    }
    const yes = el("button", "verdict-confirmed", "confirmed"), no = el("button", "verdict-false-alarm", "false alarm");
    yes.type = no.type = "button";
    yes.addEventListener("click", () => send(id, "confirmed", b));
    no.addEventListener("click", () => send(id, "false-alarm", b));
    row.append(yes, no, el("span", "verdict-out muted"));
    b.append(row);
    return b;
  }
  async function init() {
    try {
      const r = await fetch("/api/verdicts", { credentials: "same-origin" });
      const d = r.ok ? await r.json() : { enabled: false, why: `the page answered ${r.status}` };
      V.enabled = d.enabled; V.why = d.why;
    } catch (e) { V.why = String(e); }
  }
  window.healerVerdicts = {
    state: V,
    box,
    ready: init(),
    onSnapshot(d) { for (const [id, v] of Object.entries(d.verdicts || {})) V.latest.set(id, v); },
    onVerdict(v) { V.latest.set(v.incident, v); refresh(v.incident); },
    remember(id, v) { if (v) V.latest.set(id, v); },
  };
})();
