// A small line chart on a canvas, written for this page instead of vendoring a charting library: one
// series, an optional reference line (the slowdown temperature, the power limit), min/max labels and a
// seconds-ago time axis. About 60 lines, no dependencies, nothing fetched.
"use strict";
window.healerChart = function drawChart(canvas, ts, values, opts) {
  const ctx = canvas.getContext("2d");
  const dpr = window.devicePixelRatio || 1;
  const w = canvas.clientWidth || canvas.width, h = canvas.clientHeight || canvas.height;
  if (canvas.width !== Math.round(w * dpr)) { canvas.width = Math.round(w * dpr); canvas.height = Math.round(h * dpr); }
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, w, h);
  ctx.font = "10px system-ui, sans-serif";
  const left = 34, right = 6, top = 6, bottom = 14;
  const pts = [];
  for (let i = 0; i < ts.length; i++) if (values[i] !== null && values[i] !== undefined) pts.push([ts[i], values[i]]);
  ctx.fillStyle = "#8a94a0";
  if (pts.length === 0) { ctx.fillText("no readings", left, h / 2); return; }
  let lo = Infinity, hi = -Infinity;
  for (const [, v] of pts) { lo = Math.min(lo, v); hi = Math.max(hi, v); }
  if (opts.ref !== null && opts.ref !== undefined) { lo = Math.min(lo, opts.ref); hi = Math.max(hi, opts.ref); }
  if (hi - lo < 1) { hi += 0.5; lo -= 0.5; }
  const pad = (hi - lo) * 0.08; lo -= pad; hi += pad;
  const now = opts.now || ts[ts.length - 1], t0 = Math.min(ts[0], now - 10);
  const x = (t) => left + (w - left - right) * (t - t0) / Math.max(now - t0, 1e-6);
  const y = (v) => top + (h - top - bottom) * (1 - (v - lo) / (hi - lo));
  ctx.strokeStyle = "#2a3038"; ctx.lineWidth = 1;
  ctx.strokeRect(left + 0.5, top + 0.5, w - left - right - 1, h - top - bottom - 1);
  ctx.textAlign = "right";
  ctx.fillText(hi.toFixed(hi - lo > 20 ? 0 : 1), left - 3, top + 8);
  ctx.fillText(lo.toFixed(hi - lo > 20 ? 0 : 1), left - 3, h - bottom);
  ctx.textAlign = "left"; ctx.fillText(`-${Math.round(now - t0)} s`, left, h - 2);
  ctx.textAlign = "right"; ctx.fillText("now", w - right, h - 2);
  if (opts.ref !== null && opts.ref !== undefined) {
    ctx.strokeStyle = "#e03c3c"; ctx.setLineDash([4, 3]);
    ctx.beginPath(); ctx.moveTo(left, y(opts.ref)); ctx.lineTo(w - right, y(opts.ref)); ctx.stroke();
    ctx.setLineDash([]);
  }
  ctx.strokeStyle = opts.color || "#4f8fc9"; ctx.lineWidth = 1.5;
  ctx.beginPath();
  pts.forEach(([t, v], i) => (i ? ctx.lineTo(x(t), y(v)) : ctx.moveTo(x(t), y(v))));
  ctx.stroke();
};
