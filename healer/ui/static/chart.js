// A small line chart on a canvas, written for this page instead of vendoring a charting library: one
// series, an optional reference line (the slowdown temperature, the power limit), a value axis with
// round ticks and a time axis in minutes ago. Gaps in the data (a silent node) are gaps in the line.
// No dependencies, nothing fetched.
"use strict";
(function () {
  function niceStep(span, ticks) {
    const raw = span / Math.max(1, ticks), mag = Math.pow(10, Math.floor(Math.log10(raw)));
    for (const m of [1, 2, 2.5, 5, 10]) if (m * mag >= raw) return m * mag;
    return 10 * mag;
  }
  const TIME_STEPS = [30, 60, 120, 300, 600, 900, 1800, 3600, 7200];
  function timeLabel(s) {
    if (s <= 0) return "now";
    return s < 120 ? `-${Math.round(s)}s` : s < 7200 ? `-${Math.round(s / 60)}m` : `-${(s / 3600).toFixed(1)}h`;
  }
  window.healerChart = function drawChart(canvas, ts, values, opts) {
    const ctx = canvas.getContext("2d");
    const dpr = window.devicePixelRatio || 1;
    const w = canvas.clientWidth || canvas.width, h = canvas.clientHeight || canvas.height;
    if (canvas.width !== Math.round(w * dpr)) { canvas.width = Math.round(w * dpr); canvas.height = Math.round(h * dpr); }
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, w, h);
    ctx.font = "10px system-ui, sans-serif";
    const left = 40, right = 8, top = 6, bottom = 16;
    const pts = [];
    for (let i = 0; i < ts.length; i++) if (values[i] !== null && values[i] !== undefined) pts.push([ts[i], values[i]]);
    ctx.fillStyle = "#8a94a0";
    if (pts.length === 0) { ctx.fillText("no readings", left, h / 2); return { span: 0 }; }
    let lo = Infinity, hi = -Infinity;
    for (const [, v] of pts) { lo = Math.min(lo, v); hi = Math.max(hi, v); }
    const ref = opts.ref !== null && opts.ref !== undefined ? opts.ref : null;
    if (ref !== null) { lo = Math.min(lo, ref); hi = Math.max(hi, ref); }
    if (opts.min !== undefined) lo = Math.min(lo, opts.min);
    if (opts.max !== undefined) hi = Math.max(hi, opts.max);
    if (hi - lo < 2) { hi += 1; lo -= 1; }
    const vstep = niceStep(hi - lo, 4);
    lo = Math.floor(lo / vstep) * vstep; hi = Math.ceil(hi / vstep) * vstep;
    const now = opts.now || pts[pts.length - 1][0];
    const t0 = Math.min(pts[0][0], now - (opts.minSpan || 600));
    const span = now - t0;
    const x = (t) => left + (w - left - right) * (t - t0) / Math.max(span, 1e-6);
    const y = (v) => top + (h - top - bottom) * (1 - (v - lo) / (hi - lo));
    ctx.strokeStyle = "#2a3038"; ctx.lineWidth = 1;
    ctx.textAlign = "right"; ctx.textBaseline = "middle";
    for (let v = lo; v <= hi + vstep / 2; v += vstep) {
      const yy = Math.round(y(v)) + 0.5;
      ctx.beginPath(); ctx.moveTo(left, yy); ctx.lineTo(w - right, yy); ctx.stroke();
      ctx.fillText(vstep < 1 ? v.toFixed(1) : String(Math.round(v)), left - 4, yy);
    }
    const tstep = TIME_STEPS.find((s) => span / s <= 6) || 14400;
    ctx.textAlign = "center"; ctx.textBaseline = "alphabetic";
    for (let ago = 0; ago <= span; ago += tstep) {
      const xx = Math.round(x(now - ago)) + 0.5;
      ctx.beginPath(); ctx.moveTo(xx, top); ctx.lineTo(xx, h - bottom); ctx.stroke();
      ctx.fillText(timeLabel(ago), Math.min(Math.max(xx, left + 12), w - right - 10), h - 3);
    }
    if (ref !== null) {
      ctx.strokeStyle = "#e03c3c"; ctx.setLineDash([4, 3]);
      ctx.beginPath(); ctx.moveTo(left, y(ref)); ctx.lineTo(w - right, y(ref)); ctx.stroke();
      ctx.setLineDash([]);
    }
    ctx.strokeStyle = opts.color || "#4f8fc9"; ctx.lineWidth = 1.5;
    const gap = opts.gapS || 90;
    ctx.beginPath();
    pts.forEach(([t, v], i) => {
      if (i === 0 || t - pts[i - 1][0] > gap) ctx.moveTo(x(t), y(v)); else ctx.lineTo(x(t), y(v));
    });
    ctx.stroke();
    if (pts.length === 1) { ctx.fillStyle = opts.color || "#4f8fc9"; ctx.fillRect(x(pts[0][0]) - 2, y(pts[0][1]) - 2, 4, 4); }
    return { span, lo, hi };
  };
})();
