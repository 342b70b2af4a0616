// memsnap view: the page's own code. It reads the JSON element the page carries, draws on
// canvas and writes text into the DOM with textContent only (never markup from the data).
"use strict";
(function () {
  // Every string is once in DATA.strings, and referred to as {"$": index} (src/page/texts.rs):
  // put back in place once, so the rest of the page reads strings.
  const DATA = JSON.parse(document.getElementById("memsnap-data").textContent);
  const STR = DATA.strings;
  function revive(v) {
    if (Array.isArray(v)) {
      for (let i = 0; i < v.length; i++) if (v[i] !== null && typeof v[i] === "object") v[i] = revive(v[i]);
      return v;
    }
    if (v !== null && typeof v === "object") {
      const keys = Object.keys(v);
      if (keys.length === 1 && keys[0] === "$" && typeof v.$ === "number") return STR[v.$];
      for (const k of keys) if (v[k] !== null && typeof v[k] === "object" && k !== "strings") v[k] = revive(v[k]);
    }
    return v;
  }
  revive(DATA);
  // The whole text of names shown shortened, when the page carries it.
  const FULL = new Map(DATA.full.map(([i, text]) => [STR[i], text]));
  const app = document.getElementById("app");
  const api = (window.memsnapView = { data: DATA, drawTimes: [], ready: false });

  // ---- numbers ----------------------------------------------------------------------------
  const KIB = 1024, MIB = KIB * 1024, GIB = MIB * 1024;
  // Pinned host memory is reported as its own device (memsnap's number for it is 128).
  function deviceName(d) {
    return d === 128 ? "host (pinned)" : "device " + d;
  }

  function bytes(b) {
    if (b >= 1000 * MIB) return (b / GIB).toFixed(2) + " GiB";
    if (b >= 1000 * KIB) return (b / MIB).toFixed(2) + " MiB";
    if (b >= KIB) return (b / KIB).toFixed(2) + " KiB";
    return b + " B";
  }
  const count = (n) => n.toLocaleString("en-US");
  // The packed columns: base64 of zigzag varints of differences (src/page/pack.rs).
  function unpack(text) {
    const bin = atob(text);
    const out = [];
    let z = 0, mul = 1, last = 0;
    for (let i = 0; i < bin.length; i++) {
      const b = bin.charCodeAt(i);
      z += (b & 0x7f) * mul;
      if (b & 0x80) { mul *= 128; continue; }
      last += z % 2 === 1 ? -(z + 1) / 2 : z / 2;
      out.push(last);
      z = 0; mul = 1;
    }
    return Float64Array.from(out);
  }
  function el(tag, attrs, ...children) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null) continue;
      if (k === "text") e.textContent = v;
      else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
      else e.setAttribute(k, v);
    }
    for (const c of children) if (c !== null && c !== undefined) e.append(c);
    return e;
  }
  // A name as an element: a shortened one whose whole text the page carries shows it on a click.
  function nameEl(tag, attrs, name) {
    if (!FULL.has(name)) return el(tag, Object.assign({}, attrs, { text: name }));
    const e = el(tag, Object.assign({}, attrs, { text: name, class: ((attrs && attrs.class) || "") + " long",
      title: "shortened: click for the whole name" }));
    e.addEventListener("click", () => { e.textContent = FULL.get(name); e.classList.remove("long"); }, { once: true });
    return e;
  }
  const css = (name) => getComputedStyle(document.documentElement).getPropertyValue(name).trim();

  // ---- panels -----------------------------------------------------------------------------
  const panels = DATA.panels;
  const timeAxis = panels.length > 0 && panels.every((p) => p.axis === "time");
  const origin0 = timeAxis ? Math.min(...panels.map((p) => p.origin_us)) : 0;
  const cache = new Map();
  // A panel's columns, unpacked once, with its x shifted onto the shared axis.
  function P(k) {
    if (cache.has(k)) return cache.get(k);
    const p = panels[k];
    const off = timeAxis ? p.origin_us - origin0 : 0;
    const f = p.fine;
    const fine = { n: f.n, amax: unpack(f.amax), amin: unpack(f.amin), rmax: unpack(f.rmax),
      frag: unpack(f.frag), ev: unpack(f.ev) };
    const groupings = p.groupings.map((g) => {
      const ev = unpack(g.ev), x = unpack(g.x), all = unpack(g.bytes);
      const n = ev.length, rows = [];
      for (let k = 0; k < g.groups.length; k++) rows.push(all.subarray(k * n, (k + 1) * n));
      return { name: g.dimension, groups: g.groups, colours: g.colours, folded: g.folded, ev, x, rows, n };
    });
    const zoom = p.zoom.map((z) => ({ from: z.from, x: unpack(z.x), a: unpack(z.allocated), r: unpack(z.reserved) }));
    const b = p.blocks;
    const blocks = { start: unpack(b.start), end: unpack(b.end), sx: unpack(b.start_x), ex: unpack(b.end_x),
      bytes: unpack(b.bytes), stack: unpack(b.stack), labels: b.labels.map(unpack), total: b.total };
    const report = DATA.reports[p.report].devices[p.report_device];
    const v = { p, off, fine, groupings, zoom, blocks, report, xEnd: p.x_end };
    cache.set(k, v);
    return v;
  }
  const xEndAll = Math.max(1, ...panels.map((p, k) => p.x_end + (timeAxis ? p.origin_us - origin0 : 0)));

  // ---- state ------------------------------------------------------------------------------
  const state = { panel: 0, dim: 0, x0: 0, x1: 1, moment: null, showBlocks: true };
  api.state = state;
  function resetView() {
    const v = P(state.panel);
    if (panels.length > 1) { state.x0 = 0; state.x1 = xEndAll; }
    else { state.x0 = v.off; state.x1 = v.off + v.xEnd; }
  }

  // ---- layout -----------------------------------------------------------------------------
  if (panels.length === 0) {
    app.append(el("h1", { text: DATA.title }),
      el("p", { class: "note", text: "No device with memory to show." }));
    for (const [f, why] of DATA.failures) app.append(el("p", { class: "note", text: f + ": " + why }));
    api.ready = true;
    return;
  }
  const head = el("header", {},
    el("h1", { text: DATA.title }),
    el("div", { class: "meta" }, "memsnap " + DATA.version + " · made by ", el("code", { text: DATA.command })));
  const fileLine = el("div", { class: "meta", "data-testid": "file" });
  const toolbar = el("div", { class: "toolbar", role: "toolbar", "aria-label": "view" });
  const cards = el("div", { class: "cards" });
  const mainBox = el("div", { class: "chart" });
  const main = el("canvas", { id: "main", tabindex: "0", role: "img", "aria-label": "memory over time" });
  const tip = el("div", { class: "tip", role: "status" });
  mainBox.append(main, tip);
  const legend = el("div", { class: "legend", "data-testid": "legend" });
  const fragBox = el("div", { class: "chart" });
  const frag = el("canvas", { id: "frag", role: "img", "aria-label": "fragmentation over time" });
  fragBox.append(frag);
  const blocksHead = el("h2", { text: "Blocks in view" });
  const blocksNote = el("div", { class: "note" });
  const blocksBox = el("div", { class: "chart" });
  const blocksCanvas = el("canvas", { id: "blocks", role: "img", "aria-label": "blocks over their lives" });
  const blocksTip = el("div", { class: "tip" });
  blocksBox.append(blocksCanvas, blocksTip);
  const ranksSection = el("section", { id: "ranks-section" });
  const momentSection = el("section", { id: "moment", "data-testid": "moment" });
  const stepsSection = el("section", { id: "steps" });
  const oomSection = el("section", { id: "oom" });
  const compareSection = el("section", { id: "compare" });
  const help = el("footer", {},
    "Keys: ", el("kbd", { text: "←" }), " ", el("kbd", { text: "→" }), " pan · ",
    el("kbd", { text: "+" }), " ", el("kbd", { text: "−" }), " zoom · ", el("kbd", { text: "0" }),
    " whole trace · ", el("kbd", { text: "p" }), " peak · ", el("kbd", { text: "o" }), " out of memory · ",
    el("kbd", { text: "1" }), "–", el("kbd", { text: "5" }), " grouping · ", el("kbd", { text: "[" }), " ",
    el("kbd", { text: "]" }), " rank. Mouse: wheel zooms, drag zooms to a range, shift-drag pans, a click shows what was live, a double click shows the whole trace. " +
    "Every figure is memsnap's exact replay of PyTorch's caching allocator; this page makes no network request.");
  app.append(head, fileLine, toolbar, cards, mainBox, legend,
    el("h2", { text: "Fragmentation: reserved minus allocated" }), fragBox,
    ranksSection, momentSection, blocksHead, blocksNote, blocksBox, stepsSection, oomSection, compareSection, help);

  // toolbar
  const dimButtons = [];
  const dimGroup = el("div", { class: "group", role: "group", "aria-label": "group by" }, el("span", { class: "note", text: "group by" }));
  ["category", "step", "phase", "stage", "site"].forEach((name, k) => {
    const b = el("button", { type: "button", "data-dim": name, "aria-pressed": "false", text: name,
      onclick: () => { state.dim = k; render(); } });
    dimButtons.push(b);
    dimGroup.append(b);
  });
  const rankSelect = el("select", { "aria-label": "rank", "data-testid": "rank" });
  panels.forEach((p, k) => rankSelect.append(el("option", { value: String(k), text: panelName(p) })));
  rankSelect.addEventListener("change", () => choosePanel(Number(rankSelect.value)));
  const peakButton = el("button", { type: "button", "data-testid": "peak-button", text: "peak", onclick: () => showPeak() });
  const oomButton = el("button", { type: "button", "data-testid": "oom-button", text: "out of memory", onclick: () => showOom() });
  const resetButton = el("button", { type: "button", "data-testid": "reset", text: "whole trace", onclick: () => { resetView(); render(); } });
  const zoomIn = el("button", { type: "button", "aria-label": "zoom in", text: "+", onclick: () => zoomBy(0.5) });
  const zoomOut = el("button", { type: "button", "aria-label": "zoom out", text: "−", onclick: () => zoomBy(2) });
  toolbar.append(dimGroup,
    el("div", { class: "group" + (panels.length > 1 ? "" : " hidden") }, el("span", { class: "note", text: "rank" }), rankSelect),
    el("div", { class: "group" }, peakButton, oomButton, zoomIn, zoomOut, resetButton));

  // `text` as drawn in `width` pixels: whole when it fits, else its beginning and end around
  // an ellipsis, so that the rank or step a name ends with stays readable
  function fitText(g, text, width) {
    if (g.measureText(text).width <= width) return text;
    const chars = Array.from(text);
    for (let keep = chars.length - 1; keep > 1; keep--) {
      const head = Math.ceil(keep / 2), tail = keep - head;
      const t = chars.slice(0, head).join("") + "…" + chars.slice(chars.length - tail).join("");
      if (g.measureText(t).width <= width) return t;
    }
    return "…";
  }

  function panelName(p) {
    const dev = DATA.reports[p.report].devices.length > 1 ? " · " + deviceName(p.device) : "";
    return p.name + dev;
  }

  // ---- axes -------------------------------------------------------------------------------
  function xText(x) {
    if (!timeAxis) return "#" + count(Math.round(x));
    const s = x / 1e6;
    if (s === 0) return "0 s";
    if (Math.abs(s) >= 100) return s.toFixed(0) + " s";
    if (Math.abs(s) >= 1) return s.toFixed(2) + " s";
    return (s * 1000).toFixed(s * 1000 >= 10 ? 1 : 3) + " ms";
  }
  function niceStep(span, target) {
    const raw = span / Math.max(1, target);
    const p = Math.pow(10, Math.floor(Math.log10(raw)));
    for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= raw) return m * p;
    return 10 * p;
  }
  function niceBytes(max, target) {
    const units = [1, KIB, MIB, GIB];
    let u = 1;
    for (const x of units) if (max >= x) u = x;
    return niceStep(max / u, target) * u;
  }

  // ---- canvas helpers -----------------------------------------------------------------------
  function setup(canvas) {
    const dpr = window.devicePixelRatio || 1;
    const w = canvas.clientWidth, h = canvas.clientHeight;
    if (canvas.width !== Math.round(w * dpr) || canvas.height !== Math.round(h * dpr)) {
      canvas.width = Math.round(w * dpr);
      canvas.height = Math.round(h * dpr);
    }
    const g = canvas.getContext("2d");
    g.setTransform(dpr, 0, 0, dpr, 0, 0);
    g.clearRect(0, 0, w, h);
    return { g, w, h };
  }
  const M = { left: 70, right: 14, top: 16, bottom: 24 };
  function frame(w, h) {
    return { l: M.left, r: w - M.right, t: M.top, b: h - M.bottom };
  }
  const sx = (f, x) => f.l + ((x - state.x0) / (state.x1 - state.x0)) * (f.r - f.l);
  const xs = (f, px) => state.x0 + ((px - f.l) / (f.r - f.l)) * (state.x1 - state.x0);

  function drawXAxis(g, f) {
    g.fillStyle = css("--muted");
    g.strokeStyle = css("--grid");
    g.font = "11px system-ui, sans-serif";
    g.textAlign = "center";
    g.textBaseline = "top";
    const step = niceStep(state.x1 - state.x0, Math.max(2, Math.floor((f.r - f.l) / 110)));
    for (let x = Math.ceil(state.x0 / step) * step; x <= state.x1; x += step) {
      const px = sx(f, x);
      g.beginPath(); g.moveTo(px, f.t); g.lineTo(px, f.b); g.stroke();
      g.fillText(xText(x), px, f.b + 5);
    }
  }
  function drawYAxis(g, f, ymax, y) {
    g.fillStyle = css("--muted");
    g.strokeStyle = css("--grid");
    g.font = "11px system-ui, sans-serif";
    g.textAlign = "right";
    g.textBaseline = "middle";
    const step = niceBytes(ymax, Math.max(2, Math.floor((f.b - f.t) / 45)));
    for (let v = 0; v <= ymax * 1.0001; v += step) {
      const py = y(v);
      g.beginPath(); g.moveTo(f.l, py); g.lineTo(f.r, py); g.stroke();
      g.fillText(bytes(v), f.l - 6, py);
    }
  }

  // The fine columns of panel v in view, one value per pixel (max of highs, min of lows).
  function envelope(v, f) {
    const fine = v.fine, n = fine.n, span = v.xEnd + 1;
    const colOf = (x) => Math.floor(((x - v.off) * n) / span);
    const c0 = Math.max(0, colOf(state.x0) - 1), c1 = Math.min(n - 1, colOf(state.x1) + 1);
    const out = [];
    if (c1 < c0) return out;
    let cur = null;
    for (let c = c0; c <= c1; c++) {
      const xa = v.off + (c * span) / n, xb = v.off + ((c + 1) * span) / n;
      const pa = Math.floor(sx(f, xa)), pb = Math.max(pa, Math.floor(sx(f, xb)));
      if (cur && cur.pa === pa) {
        cur.hi = Math.max(cur.hi, fine.amax[c]); cur.lo = Math.min(cur.lo, fine.amin[c]);
        cur.r = Math.max(cur.r, fine.rmax[c]); cur.frag = Math.max(cur.frag, fine.frag[c]); cur.pb = pb; cur.c1 = c;
      } else {
        cur = { pa, pb, hi: fine.amax[c], lo: fine.amin[c], r: fine.rmax[c], frag: fine.frag[c], c0: c, c1: c };
        out.push(cur);
      }
    }
    return out;
  }
  // Events around the peak or a failure, when the view is that close.
  function rawInView(v) {
    for (const z of v.zoom) {
      const n = z.x.length;
      if (n < 2) continue;
      if (z.x[0] + v.off <= state.x0 && z.x[n - 1] + v.off >= state.x1) return z;
    }
    return null;
  }

  // ---- the main chart ------------------------------------------------------------------------
  function drawMain() {
    const t0 = performance.now();
    const v = P(state.panel);
    const { g, w, h } = setup(main);
    const f = frame(w, h);
    const env = envelope(v, f);
    const raw = rawInView(v);
    const fineWide = env.length > 0 && env.length < (f.r - f.l) / 3;
    let ymax = 1;
    for (const c of env) ymax = Math.max(ymax, c.hi, c.r);
    if (raw) for (let i = 0; i < raw.x.length; i++) ymax = Math.max(ymax, raw.a[i], raw.r[i]);
    ymax *= 1.06;
    const y = (b) => f.b - (b / ymax) * (f.b - f.t);
    // step bands
    const steps = v.report.steps;
    g.font = "11px system-ui, sans-serif";
    g.textBaseline = "top";
    g.textAlign = "left";
    steps.forEach((s, k) => {
      const [a, b] = v.p.step_x[k];
      const pa = Math.max(f.l, sx(f, a + v.off)), pb = Math.min(f.r, sx(f, b + v.off));
      if (pb < f.l || pa > f.r) return;
      if (k % 2 === 0) { g.fillStyle = css("--band"); g.fillRect(pa, f.t, Math.max(1, pb - pa), f.b - f.t); }
      const label = s.label;
      if (pb - pa > g.measureText(label).width + 6) { g.fillStyle = css("--muted"); g.fillText(label, pa + 3, 2); }
    });
    drawYAxis(g, f, ymax, y);
    drawXAxis(g, f);
    g.save();
    g.beginPath(); g.rect(f.l, f.t - 2, f.r - f.l, f.b - f.t + 2); g.clip();
    // stacked groups at the grouping's columns
    const gr = v.groupings[state.dim];
    const cols = columnsInView(v, gr);
    if (cols.length > 0 && !(raw && fineWide)) {
      const base = new Float64Array(cols.length);
      for (let k = 0; k < gr.groups.length; k++) {
        const row = gr.rows[k];
        g.beginPath();
        cols.forEach((c, i) => { const px = sx(f, gr.x[c] + v.off); const py = y(base[i] + row[c]); i === 0 ? g.moveTo(px, py) : g.lineTo(px, py); });
        for (let i = cols.length - 1; i >= 0; i--) g.lineTo(sx(f, gr.x[cols[i]] + v.off), y(base[i]));
        g.closePath();
        g.fillStyle = gr.colours[k];
        g.globalAlpha = 0.85;
        g.fill();
        g.globalAlpha = 1;
        cols.forEach((c, i) => { base[i] += row[c]; });
      }
    }
    // allocated: the fine envelope (or the events themselves when that close)
    g.lineWidth = 1.25;
    if (raw && fineWide) {
      g.strokeStyle = css("--fg");
      stepLine(g, f, raw, raw.a, v.off, y);
      g.setLineDash([5, 3]); g.strokeStyle = css("--reserved");
      stepLine(g, f, raw, raw.r, v.off, y);
      g.setLineDash([]);
    } else {
      g.strokeStyle = css("--fg");
      g.beginPath();
      env.forEach((c, i) => { const py = y(c.hi); i === 0 ? g.moveTo(c.pa, py) : g.lineTo(c.pa, py); g.lineTo(c.pb + 1, py); });
      g.stroke();
      g.globalAlpha = 0.35;
      g.beginPath();
      env.forEach((c, i) => { const py = y(c.lo); i === 0 ? g.moveTo(c.pa, py) : g.lineTo(c.pa, py); g.lineTo(c.pb + 1, py); });
      g.stroke();
      g.globalAlpha = 1;
      g.setLineDash([5, 3]); g.strokeStyle = css("--reserved");
      g.beginPath();
      env.forEach((c, i) => { const py = y(c.r); i === 0 ? g.moveTo(c.pa, py) : g.lineTo(c.pa, py); g.lineTo(c.pb + 1, py); });
      g.stroke();
      g.setLineDash([]);
    }
    g.restore();
    // markers
    const mark = (x, colour, text, top) => {
      const px = sx(f, x);
      if (px < f.l - 1 || px > f.r + 1) return;
      g.strokeStyle = colour; g.lineWidth = 1.5;
      g.beginPath(); g.moveTo(px, f.t); g.lineTo(px, f.b); g.stroke();
      g.fillStyle = colour; g.font = "bold 11px system-ui, sans-serif";
      const tw = g.measureText(text).width;
      g.textAlign = px + tw + 6 > f.r ? "right" : "left";
      g.fillText(text, px + (g.textAlign === "right" ? -4 : 4), f.t + top);
    };
    if (v.p.peak.event >= 0) mark(v.p.peak.x + v.off, css("--peak"), "peak " + bytes(v.p.peak.bytes), 2);
    v.p.ooms.forEach((o) => mark(o.x + v.off, css("--oom"), "out of memory: " + bytes(o.requested), 16));
    if (state.moment) mark(state.moment.x + v.off, css("--moment"), "#" + count(state.moment.event), 30);
    const ms = performance.now() - t0;
    api.drawTimes.push(ms);
    if (api.drawTimes.length > 500) api.drawTimes.shift();
    return ms;
  }
  function stepLine(g, f, raw, values, off, y) {
    g.beginPath();
    for (let i = 0; i < raw.x.length; i++) {
      const px = sx(f, raw.x[i] + off), py = y(values[i]);
      if (i === 0) g.moveTo(px, py);
      else { g.lineTo(px, y(values[i - 1])); g.lineTo(px, py); }
    }
    g.stroke();
  }
  // The grouping's columns in view, with one more on each side.
  function columnsInView(v, gr) {
    const lo = lowerBound(gr.x, state.x0 - v.off), hi = lowerBound(gr.x, state.x1 - v.off);
    const out = [];
    for (let c = Math.max(0, lo - 1); c <= Math.min(gr.n - 1, hi); c++) out.push(c);
    return out;
  }
  function lowerBound(arr, x) {
    let lo = 0, hi = arr.length;
    while (lo < hi) { const m = (lo + hi) >> 1; if (arr[m] < x) lo = m + 1; else hi = m; }
    return lo;
  }
  function nearestColumn(gr, x) {
    const i = lowerBound(gr.x, x);
    if (i <= 0) return 0;
    if (i >= gr.n) return gr.n - 1;
    return x - gr.x[i - 1] <= gr.x[i] - x ? i - 1 : i;
  }

  function drawLegend() {
    const v = P(state.panel);
    const gr = v.groupings[state.dim];
    legend.replaceChildren();
    gr.groups.forEach((name, k) => {
      let most = 0;
      for (const b of gr.rows[k]) most = Math.max(most, b);
      if (most === 0) return;
      legend.append(el("span", { title: name + ": up to " + bytes(most) },
        el("i", { style: "background:" + gr.colours[k] }), name));
    });
    legend.append(el("span", {}, el("i", { style: "background:transparent;border-top:2px dashed " + css("--reserved") }), "reserved"));
    legend.append(el("span", {}, el("i", { style: "background:transparent;border-top:2px solid " + css("--fg") }), "allocated (highest and lowest per pixel)"));
  }

  function drawFrag() {
    const v = P(state.panel);
    const { g, w, h } = setup(frag);
    const f = { l: M.left, r: w - M.right, t: 8, b: h - 20 };
    const env = envelope(v, f);
    let ymax = 1;
    for (const c of env) ymax = Math.max(ymax, c.frag);
    ymax *= 1.1;
    const y = (b) => f.b - (b / ymax) * (f.b - f.t);
    drawYAxis(g, f, ymax, y);
    g.save(); g.beginPath(); g.rect(f.l, f.t, f.r - f.l, f.b - f.t); g.clip();
    g.fillStyle = css("--reserved"); g.globalAlpha = 0.35;
    for (const c of env) g.fillRect(c.pa, y(c.frag), Math.max(1, c.pb - c.pa + 1), f.b - y(c.frag));
    g.globalAlpha = 1; g.restore();
    g.fillStyle = css("--muted"); g.font = "11px system-ui, sans-serif"; g.textAlign = "right"; g.textBaseline = "top";
    g.fillText("largest free cached block at the end: " + bytes(v.report.largest_free_block_bytes), f.r, f.b + 4);
  }

  // ---- blocks -----------------------------------------------------------------------------
  const MAX_BLOCKS_DRAWN = 4000;
  let placedBlocks = [];
  function drawBlocks() {
    const v = P(state.panel), b = v.blocks;
    const { g, w, h } = setup(blocksCanvas);
    const f = frame(w, h);
    const inView = [];
    for (let i = 0; i < b.bytes.length; i++) {
      if (b.ex[i] + v.off >= state.x0 && b.sx[i] + v.off <= state.x1) inView.push(i);
    }
    placedBlocks = [];
    const carried = b.bytes.length === b.total ? "all " + count(b.total) + " blocks" :
      "the " + count(b.bytes.length) + " largest of " + count(b.total) + " blocks (the largest of the trace and those live at the peak)";
    if (inView.length > MAX_BLOCKS_DRAWN) {
      blocksNote.textContent = count(inView.length) + " blocks in view: zoom in to draw them (the page carries " + carried + ").";
      return;
    }
    blocksNote.textContent = "Each band is one allocation over its life, stacked as they were allocated; " + count(inView.length) +
      " in view, of " + carried + ".";
    inView.sort((p, q) => b.start[p] - b.start[q] || p - q);
    // each block sits on top of those live when it was allocated, and keeps its place
    const live = [];
    let ymax = 1;
    for (const i of inView) {
      const s = b.start[i];
      for (let k = live.length - 1; k >= 0; k--) if (b.end[live[k].i] >= 0 && b.end[live[k].i] <= s) live.splice(k, 1);
      let top = 0;
      for (const l of live) top = Math.max(top, l.y + b.bytes[l.i]);
      const item = { i, y: top };
      live.push(item);
      placedBlocks.push(item);
      ymax = Math.max(ymax, top + b.bytes[i]);
    }
    ymax *= 1.04;
    const y = (v2) => f.b - (v2 / ymax) * (f.b - f.t);
    drawYAxis(g, f, ymax, y);
    drawXAxis(g, f);
    const gr = v.groupings[state.dim];
    const colourOf = new Map(gr.groups.map((n, k) => [n, gr.colours[k]]));
    const other = gr.colours[gr.colours.length - 1];
    const labels = b.labels[state.dim];
    g.save(); g.beginPath(); g.rect(f.l, f.t, f.r - f.l, f.b - f.t); g.clip();
    for (const it of placedBlocks) {
      const i = it.i;
      const pa = sx(f, b.sx[i] + v.off), pb = sx(f, b.ex[i] + v.off);
      const ya = y(it.y + b.bytes[i]), yb = y(it.y);
      g.fillStyle = colourOf.get(v.p.strings[labels[i]]) || other;
      g.fillRect(pa, ya, Math.max(1, pb - pa), Math.max(1, yb - ya));
      it.box = [pa, ya, Math.max(1, pb - pa), Math.max(1, yb - ya)];
    }
    g.restore();
  }
  blocksCanvas.addEventListener("mousemove", (e) => {
    const r = blocksCanvas.getBoundingClientRect(), px = e.clientX - r.left, py = e.clientY - r.top;
    const v = P(state.panel), b = v.blocks;
    const hit = placedBlocks.find((it) => it.box && px >= it.box[0] && px <= it.box[0] + it.box[2] && py >= it.box[1] && py <= it.box[1] + it.box[3]);
    if (!hit) { blocksTip.style.display = "none"; return; }
    const i = hit.i;
    blocksTip.replaceChildren(el("b", { text: bytes(b.bytes[i]) }), " · " + v.p.strings[b.labels[0][i]],
      el("br"), "allocated " + (b.start[i] < 0 ? "before the trace" : "at #" + count(b.start[i])) + ", " +
      (b.end[i] < 0 ? "alive at the end" : "freed at #" + count(b.end[i])),
      el("br"), v.p.strings[b.labels[1][i]] + " · " + v.p.strings[b.labels[3][i]]);
    blocksTip.style.display = "block";
    placeTip(blocksTip, blocksBox, px, py);
  });
  blocksCanvas.addEventListener("mouseleave", () => { blocksTip.style.display = "none"; });

  // ---- ranks ------------------------------------------------------------------------------
  function drawRanks() {
    ranksSection.replaceChildren();
    if (panels.length < 2) return;
    if (panels.length <= 16) {
      ranksSection.append(el("h2", { text: "Every rank on the same time axis (click one to show it)" }));
      const box = el("div", { id: "ranks" });
      ranksSection.append(box);
      let ymax = 1;
      panels.forEach((p) => { ymax = Math.max(ymax, p.peak_reserved, p.peak.bytes); });
      panels.forEach((p, k) => {
        const c = el("canvas", { "data-rank": String(k), "aria-label": panelName(p), role: "button", tabindex: "0" });
        box.append(c);
        c.addEventListener("click", () => choosePanel(k));
        c.addEventListener("keydown", (e) => { if (e.key === "Enter") choosePanel(k); });
        requestAnimationFrame(() => {
          const v = P(k);
          const { g, w, h } = setup(c);
          const f = { l: M.left, r: w - M.right, t: 3, b: h - 3 };
          const y = (b) => f.b - (b / ymax) * (f.b - f.t);
          if (k === state.panel) { g.fillStyle = css("--band"); g.fillRect(0, 0, w, h); }
          g.fillStyle = css("--fg"); g.font = (k === state.panel ? "bold " : "") + "11px system-ui, sans-serif";
          g.textAlign = "right"; g.textBaseline = "middle";
          g.fillText(fitText(g, panelName(p), f.l - 8), f.l - 6, h / 2);
          g.fillStyle = css("--accent"); g.globalAlpha = 0.7;
          for (const col of envelope(v, f)) g.fillRect(col.pa, y(col.hi), Math.max(1, col.pb - col.pa + 1), f.b - y(col.hi));
          g.globalAlpha = 1;
          const px = sx(f, p.peak.x + v.off);
          if (p.peak.event >= 0 && px >= f.l && px <= f.r) { g.fillStyle = css("--peak"); g.fillRect(px - 1, f.t, 2, f.b - f.t); }
        });
      });
    } else {
      ranksSection.append(el("h2", { text: "Peak allocated and reserved of each rank (click a bar to show it)" }));
      const c = el("canvas", { id: "rankbars", role: "img", "aria-label": "peak of each rank" });
      ranksSection.append(c);
      requestAnimationFrame(() => {
        const { g, w, h } = setup(c);
        const f = { l: M.left, r: w - M.right, t: 8, b: h - 20 };
        let ymax = 1;
        panels.forEach((p) => { ymax = Math.max(ymax, p.peak_reserved, p.peak.bytes); });
        ymax *= 1.05;
        const y = (b) => f.b - (b / ymax) * (f.b - f.t);
        drawYAxis(g, f, ymax, y);
        const bw = (f.r - f.l) / panels.length;
        panels.forEach((p, k) => {
          g.fillStyle = css("--reserved"); g.globalAlpha = 0.3;
          g.fillRect(f.l + k * bw + 1, y(p.peak_reserved), Math.max(1, bw - 2), f.b - y(p.peak_reserved));
          g.globalAlpha = k === state.panel ? 1 : 0.75; g.fillStyle = k === state.panel ? css("--peak") : css("--accent");
          g.fillRect(f.l + k * bw + 1, y(p.peak.bytes), Math.max(1, bw - 2), f.b - y(p.peak.bytes));
          g.globalAlpha = 1;
          if (bw > 16 || k % Math.ceil(16 / bw) === 0) {
            g.fillStyle = css("--muted"); g.font = "10px system-ui, sans-serif"; g.textAlign = "center"; g.textBaseline = "top";
            g.fillText(p.rank !== null && p.rank !== undefined ? String(p.rank) : String(k), f.l + (k + 0.5) * bw, f.b + 3);
          }
        });
        c.onclick = (e) => {
          const r = c.getBoundingClientRect();
          const k = Math.floor((e.clientX - r.left - f.l) / bw);
          if (k >= 0 && k < panels.length) choosePanel(k);
        };
      });
    }
  }

  // ---- a moment: what was live ------------------------------------------------------------
  function momentAtX(x) {
    const v = P(state.panel);
    const gr = v.groupings[0];
    if (gr.n === 0) return null;
    const c = nearestColumn(gr, x - v.off);
    return { event: gr.ev[c], x: gr.x[c] };
  }
  function showMoment(m) {
    state.moment = m;
    renderMoment();
    drawMain();
  }
  function columnOfEvent(gr, event) {
    const i = lowerBound(gr.ev, event);
    if (i < gr.n && gr.ev[i] === event) return i;
    // a trace whose clock went back has its columns out of event order
    return gr.ev.indexOf(event);
  }
  function renderMoment() {
    const v = P(state.panel), m = state.moment;
    momentSection.replaceChildren();
    if (!m) {
      momentSection.append(el("h2", { text: "What was live" }),
        el("p", { class: "note", text: "Click the chart, or press the peak button, to see what was live at a moment." }));
      return;
    }
    const isPeak = m.event === v.p.peak.event;
    const g0 = v.groupings[0], c0 = columnOfEvent(g0, m.event);
    let total = 0;
    if (c0 >= 0) for (const row of g0.rows) total += row[c0];
    momentSection.append(el("h2", { text: "What was live after event #" + count(m.event) + (isPeak ? " (the peak)" : "") }));
    momentSection.append(el("p", { class: "note" },
      "At " + xText(m.x + v.off) + ": ",
      el("b", { "data-testid": "moment-allocated", "data-bytes": String(total), "data-event": String(m.event), text: bytes(total) }),
      " allocated (" + count(total) + " bytes)."));
    const grid = el("div", { class: "grid2" });
    v.groupings.forEach((gr) => {
      const c = columnOfEvent(gr, m.event);
      if (c < 0) return;
      const rows = gr.groups.map((name, k) => [name, gr.rows[k][c]]).filter((r) => r[1] > 0).sort((a, b) => b[1] - a[1]);
      const tb = el("tbody");
      for (const [name, b] of rows) {
        tb.append(el("tr", { "data-label": name, "data-bytes": String(b) },
          el("td", { class: "label", text: name }), el("td", { class: "n", text: bytes(b) }),
          el("td", { class: "n", text: total > 0 ? ((100 * b) / total).toFixed(1) + "%" : "" })));
      }
      grid.append(el("div", { "data-testid": "breakdown-" + gr.name }, el("h3", { text: "by " + gr.name }),
        el("div", { class: "scroll" }, el("table", {}, el("thead", {}, el("tr", {}, el("th", { text: gr.name }), el("th", { class: "n", text: "bytes" }), el("th", { class: "n", text: "share" }))), tb))));
    });
    momentSection.append(grid);
    // the largest blocks live then
    const b = v.blocks;
    const live = [];
    let liveBytes = 0;
    for (let i = 0; i < b.bytes.length; i++) {
      if (b.start[i] <= m.event && (b.end[i] < 0 || b.end[i] > m.event)) { live.push(i); liveBytes += b.bytes[i]; }
    }
    live.sort((p, q) => b.bytes[q] - b.bytes[p] || p - q);
    momentSection.append(el("h2", { text: "Largest blocks live then" }));
    const note = b.bytes.length === b.total ? "" :
      " The page carries the largest blocks only: these " + count(live.length) + " hold " + bytes(liveBytes) + " of the " + bytes(total) + " live.";
    momentSection.append(el("p", { class: "note", text: "Program frames first, innermost first; PyTorch's own frames are folded." + note }));
    const tb = el("tbody");
    for (const i of live.slice(0, 25)) {
      tb.append(el("tr", { "data-bytes": String(b.bytes[i]) },
        el("td", { class: "n", text: bytes(b.bytes[i]) }),
        el("td", { text: v.p.strings[b.labels[0][i]] }),
        el("td", { class: "label", text: v.p.strings[b.labels[1][i]] }),
        el("td", { class: "n", text: b.start[i] < 0 ? "before" : "#" + count(b.start[i]) }),
        el("td", { class: "n", text: b.end[i] < 0 ? "alive" : "#" + count(b.end[i]) }),
        el("td", { class: "label" }, stackView(v, b.stack[i]))));
    }
    momentSection.append(el("div", { class: "scroll" }, el("table", { "data-testid": "blocks-table" },
      el("thead", {}, el("tr", {}, ...["bytes", "category", "step", "allocated", "freed", "stack"].map((t, k) => el("th", { class: k === 0 || k === 3 || k === 4 ? "n" : "", text: t })))), tb)));
    // flame
    momentSection.append(el("h2", { text: "Stacks of the memory live then" }));
    let lines;
    if (isPeak) {
      lines = v.p.peak_flame.lines.map((l, k) => [l.map((s) => v.p.strings[s]), v.p.peak_flame.bytes[k]]);
      momentSection.append(el("p", { class: "note", text: "Every block live at the peak, by category, then program frames, outermost first." }));
    } else {
      lines = live.map((i) => {
        const st = v.p.stacks[b.stack[i]];
        const fr = st.program.slice().reverse().map((s) => v.p.strings[s]);
        return [[v.p.strings[b.labels[0][i]], ...(fr.length ? fr : ["<no program frames>"])], b.bytes[i]];
      });
      momentSection.append(el("p", { class: "note", text: "The carried blocks live then (" + bytes(liveBytes) + "), by category, then program frames, outermost first." }));
    }
    momentSection.append(flame(lines, v));
  }
  function stackView(v, s) {
    const st = v.p.stacks[s];
    const d = el("details", { class: "stack" });
    const first = st.program.length ? v.p.strings[st.program[0]] : st.plumbing.length ? v.p.strings[st.plumbing[0]] : "no frames";
    d.append(el("summary", { text: first }));
    const ol = el("ol");
    for (const f of st.program) ol.append(nameEl("li", {}, v.p.strings[f]));
    if (st.cut) ol.append(el("li", { class: "lib", text: "… " + count(st.cut) + " outer frames of the program left out" }));
    if (st.plumbing.length) {
      const inner = el("details", {}, el("summary", { text: st.plumbing.length + st.more + " frames of PyTorch and the standard library" }));
      const ol2 = el("ol");
      for (const f of st.plumbing) ol2.append(nameEl("li", { class: "lib" }, v.p.strings[f]));
      if (st.more) ol2.append(el("li", { class: "lib", text: "… " + st.more + " more" }));
      inner.append(ol2);
      ol.append(el("li", { class: "lib" }, inner));
    }
    d.append(ol);
    return d;
  }
  // An icicle: the root level on top, each frame under its caller, widths by bytes.
  function flame(lines, v) {
    const root = { name: "all", bytes: 0, kids: new Map() };
    for (const [frames, b] of lines) {
      root.bytes += b;
      let node = root;
      // 40 levels, and the line's note of frames left out when it has one
      for (const name of frames.slice(0, 41)) {
        let k = node.kids.get(name);
        if (!k) { k = { name, bytes: 0, kids: new Map() }; node.kids.set(name, k); }
        k.bytes += b;
        node = k;
      }
    }
    const box = el("div", { class: "flame", "data-testid": "flame" });
    const gr = v.groupings[0];
    const colourOf = new Map(gr.groups.map((n, k) => [n, gr.colours[k]]));
    let depth = 0, drawn = 0;
    const walk = (node, left, d, colour) => {
      const kids = [...node.kids.values()].sort((a, b) => b.bytes - a.bytes);
      let x = left;
      for (const k of kids) {
        const wpct = root.bytes > 0 ? (100 * k.bytes) / root.bytes : 0;
        if (wpct < 0.2 || drawn > 3000) { x += wpct; continue; }
        const c = d === 0 ? colourOf.get(k.name) || "#bab0ac" : colour;
        const div = el("div", { title: k.name + "\n" + bytes(k.bytes) + " (" + count(k.bytes) + " bytes)", text: k.name,
          style: "left:" + x + "%;width:" + wpct + "%;top:" + d * 18 + "px;background:" + c + ";filter:brightness(" + (1 + (d % 3) * 0.08) + ")" });
        box.append(div);
        drawn++;
        depth = Math.max(depth, d + 1);
        walk(k, x, d + 1, c);
        x += wpct;
      }
    };
    walk(root, 0, 0, "#bab0ac");
    box.style.height = depth * 18 + 2 + "px";
    return box;
  }

  // ---- steps, OOM, comparison ---------------------------------------------------------------
  function renderSteps() {
    const v = P(state.panel);
    stepsSection.replaceChildren(el("h2", { text: "Steps (click a row to zoom to it)" }));
    const tb = el("tbody");
    v.report.steps.forEach((s, k) => {
      const tr = el("tr", { class: "link", tabindex: "0", "data-step": String(k), "data-first-event": String(s.first_event),
        "data-last-event": String(s.last_event), "data-end-bytes": String(s.end_allocated_bytes), "data-peak-bytes": String(s.peak_allocated_bytes) },
        el("td", { class: "n", text: String(s.train_step) }),
        el("td", { text: s.label }),
        el("td", { class: "n", text: s.iterations === null || s.iterations === undefined ? "" : String(s.iterations) }),
        el("td", { class: "n", text: bytes(s.start_allocated_bytes) }),
        el("td", { class: "n", text: bytes(s.peak_allocated_bytes) }),
        el("td", { class: "n", text: bytes(s.end_allocated_bytes) }),
        el("td", { class: "n", text: "#" + count(s.first_event) + " – #" + count(s.last_event) }));
      const go = () => {
        const [a, b] = v.p.step_x[k];
        const pad = Math.max(1, (b - a) * 0.03);
        state.x0 = a + v.off - pad; state.x1 = b + v.off + pad;
        state.moment = { event: s.peak_event_index, x: xOfEvent(v, s.peak_event_index) };
        render();
      };
      tr.addEventListener("click", go);
      tr.addEventListener("keydown", (e) => { if (e.key === "Enter") go(); });
      tb.append(tr);
    });
    stepsSection.append(el("div", { class: "scroll" }, el("table", { "data-testid": "steps-table" },
      el("thead", {}, el("tr", {}, ...["train step", "step", "iterations", "start", "peak", "end", "events"].map((t, k) => el("th", { class: k === 1 ? "" : "n", text: t })))), tb)));
  }
  // x of an event: exact where a grouping column or the zoomed events have it, else the
  // nearest column's.
  function xOfEvent(v, e) {
    for (const z of v.zoom) if (e >= z.from && e < z.from + z.x.length) return z.x[e - z.from];
    const gr = v.groupings[0];
    const i = Math.min(gr.n - 1, lowerBound(gr.ev, e));
    return gr.x[Math.max(0, i)];
  }
  function renderOom() {
    const v = P(state.panel);
    oomSection.replaceChildren();
    oomButton.classList.toggle("hidden", v.p.ooms.length === 0);
    if (!v.p.oom_text) return;
    oomSection.append(el("h2", { text: "Out of memory" }), el("pre", { "data-testid": "oom-text", text: v.p.oom_text }));
  }
  function renderCompare() {
    compareSection.replaceChildren();
    if (DATA.compare_text) {
      compareSection.append(el("h2", { text: panels.length > 2 ? "Ranks compared" : "The two compared" }),
        el("pre", { "data-testid": "compare-text", text: DATA.compare_text }));
    }
    for (const [f, why] of DATA.failures) compareSection.append(el("p", { class: "note", text: f + ": " + why }));
  }
  function renderHeader() {
    const v = P(state.panel), r = v.report, p = v.p;
    const file = DATA.reports[p.report];
    fileLine.textContent = p.file + " · " + deviceName(p.device) + " · " + count(p.events) + " events · stacks: " + r.stacks +
      " · allocator: " + (file.allocator_settings || "not recorded") + (r.replay_consistent ? " · replay matches the snapshot exactly" : " · replay differs from the snapshot's final state");
    cards.replaceChildren();
    const card = (k, value, id, exact) => cards.append(el("div", { class: "card" }, el("div", { class: "k", text: k }),
      el("div", { class: "v", "data-testid": id, "data-bytes": exact === undefined ? null : String(exact), title: exact === undefined ? null : count(exact) + " bytes", text: value })));
    card("peak allocated", bytes(r.peak_allocated_bytes), "peak-allocated", r.peak_allocated_bytes);
    card("peak reserved", bytes(r.peak_reserved_bytes), "peak-reserved", r.peak_reserved_bytes);
    card("at trace start", bytes(r.start_allocated_bytes), "start-allocated", r.start_allocated_bytes);
    card("at the end", bytes(r.end_allocated_bytes), "end-allocated", r.end_allocated_bytes);
    card("fragmentation at the peak", bytes(r.fragmentation_at_peak_bytes), "fragmentation", r.fragmentation_at_peak_bytes);
    card("peak reached in", p.peak_place || "before the trace", "peak-place");
    dimButtons.forEach((b, k) => b.setAttribute("aria-pressed", String(k === state.dim)));
    rankSelect.value = String(state.panel);
  }

  // ---- interaction --------------------------------------------------------------------------
  function render() {
    renderHeader();
    drawMain();
    drawLegend();
    drawFrag();
    drawBlocks();
    drawRanks();
    renderMoment();
    renderSteps();
    renderOom();
  }
  function redrawCharts() {
    drawMain(); drawFrag(); drawBlocks();
    if (panels.length > 1 && panels.length <= 16) drawRanks();
  }
  function choosePanel(k) {
    if (k < 0 || k >= panels.length) return;
    state.panel = k;
    state.moment = null;
    if (panels.length === 1) resetView();
    render();
  }
  function showPeak() {
    const v = P(state.panel);
    if (v.p.peak.event < 0) return;
    state.moment = { event: v.p.peak.event, x: v.p.peak.x };
    render();
  }
  function showOom() {
    const v = P(state.panel);
    if (!v.p.ooms.length) return;
    const o = v.p.ooms[0];
    const span = Math.max(50, (state.x1 - state.x0) / 20);
    state.x0 = o.x + v.off - span; state.x1 = o.x + v.off + span;
    state.moment = momentAtX(o.x + v.off);
    render();
    oomSection.scrollIntoView({ block: "nearest" });
  }
  function zoomBy(factor, at) {
    const mid = at === undefined ? (state.x0 + state.x1) / 2 : at;
    const minSpan = timeAxis ? 1 : 2;
    let a = mid - (mid - state.x0) * factor, b = mid + (state.x1 - mid) * factor;
    if (b - a < minSpan) { a = mid - minSpan / 2; b = mid + minSpan / 2; }
    state.x0 = a; state.x1 = b;
    clampView();
    redrawCharts();
  }
  function panBy(fraction) {
    const d = (state.x1 - state.x0) * fraction;
    state.x0 += d; state.x1 += d;
    clampView();
    redrawCharts();
  }
  function clampView() {
    const v = P(state.panel);
    const lo = panels.length > 1 ? 0 : v.off, hi = panels.length > 1 ? xEndAll : v.off + v.xEnd;
    const span = Math.min(state.x1 - state.x0, (hi - lo) * 1.2);
    if (state.x0 < lo - span * 0.1) { state.x0 = lo - span * 0.1; state.x1 = state.x0 + span; }
    if (state.x1 > hi + span * 0.1) { state.x1 = hi + span * 0.1; state.x0 = state.x1 - span; }
  }
  let drag = null;
  main.addEventListener("wheel", (e) => {
    e.preventDefault();
    const r = main.getBoundingClientRect(), f = frame(main.clientWidth, main.clientHeight);
    zoomBy(e.deltaY > 0 ? 1.25 : 0.8, xs(f, e.clientX - r.left));
  }, { passive: false });
  main.addEventListener("pointerdown", (e) => {
    const r = main.getBoundingClientRect();
    drag = { px: e.clientX - r.left, x0: state.x0, x1: state.x1, pan: e.shiftKey || e.pointerType === "touch", moved: false };
    main.setPointerCapture(e.pointerId);
  });
  main.addEventListener("pointermove", (e) => {
    const r = main.getBoundingClientRect(), px = e.clientX - r.left, py = e.clientY - r.top;
    const f = frame(main.clientWidth, main.clientHeight);
    if (drag) {
      if (Math.abs(px - drag.px) > 3) drag.moved = true;
      if (drag.pan && drag.moved) {
        const d = ((px - drag.px) / (f.r - f.l)) * (drag.x1 - drag.x0);
        state.x0 = drag.x0 - d; state.x1 = drag.x1 - d;
        redrawCharts();
      } else if (drag.moved) {
        drawMain();
        const g = main.getContext("2d");
        g.fillStyle = css("--accent"); g.globalAlpha = 0.15;
        g.fillRect(Math.min(px, drag.px), f.t, Math.abs(px - drag.px), f.b - f.t);
        g.globalAlpha = 1;
      }
      return;
    }
    hover(px, py, f);
  });
  main.addEventListener("pointerup", (e) => {
    const r = main.getBoundingClientRect(), px = e.clientX - r.left;
    const f = frame(main.clientWidth, main.clientHeight);
    const d = drag;
    drag = null;
    if (!d) return;
    if (!d.moved) { if (px >= f.l && px <= f.r) showMoment(momentAtX(xs(f, px))); return; }
    if (!d.pan) {
      const a = xs(f, Math.min(px, d.px)), b = xs(f, Math.max(px, d.px));
      if (b > a) { state.x0 = a; state.x1 = b; }
      redrawCharts();
    }
  });
  main.addEventListener("pointerleave", () => { tip.style.display = "none"; });
  main.addEventListener("dblclick", () => { resetView(); redrawCharts(); });
  function hover(px, py, f) {
    if (px < f.l || px > f.r) { tip.style.display = "none"; return; }
    const v = P(state.panel);
    const x = xs(f, px);
    const fine = v.fine, n = fine.n;
    const c = Math.min(n - 1, Math.max(0, Math.floor(((x - v.off) * n) / (v.xEnd + 1))));
    const gr = v.groupings[state.dim];
    if (gr.n === 0) { tip.style.display = "none"; return; }
    const gc = nearestColumn(gr, x - v.off);
    const parts = gr.groups.map((name, k) => [name, gr.rows[k][gc], gr.colours[k]]).filter((p) => p[1] > 0).sort((a, b) => b[1] - a[1]).slice(0, 6);
    tip.replaceChildren(el("b", { text: xText(x) }), el("br"),
      "allocated ", el("b", { text: bytes(fine.amax[c]) }), fine.amin[c] !== fine.amax[c] ? " (lowest " + bytes(fine.amin[c]) + ")" : "",
      el("br"), "reserved ", el("b", { text: bytes(fine.rmax[c]) }),
      el("br"), el("span", { class: "note", text: "by " + gr.name + " after #" + count(gr.ev[gc]) + ":" }));
    for (const [name, b, colour] of parts) {
      tip.append(el("br"), el("i", { style: "display:inline-block;width:9px;height:9px;margin-right:4px;background:" + colour }), name + " ", el("b", { text: bytes(b) }));
    }
    tip.style.display = "block";
    placeTip(tip, mainBox, px, py);
  }
  function placeTip(t, box, px, py) {
    const w = t.offsetWidth, bw = box.clientWidth;
    t.style.left = (px + 14 + w > bw ? Math.max(0, px - 14 - w) : px + 14) + "px";
    t.style.top = Math.max(0, py - 10) + "px";
  }
  document.addEventListener("keydown", (e) => {
    if (e.target instanceof HTMLSelectElement || e.ctrlKey || e.metaKey || e.altKey) return;
    const k = e.key;
    if (k === "ArrowLeft") panBy(-0.2);
    else if (k === "ArrowRight") panBy(0.2);
    else if (k === "+" || k === "=") zoomBy(0.5);
    else if (k === "-" || k === "_") zoomBy(2);
    else if (k === "0" || k === "Escape") { resetView(); redrawCharts(); }
    else if (k === "p") showPeak();
    else if (k === "o") showOom();
    else if (k >= "1" && k <= "5") { state.dim = Number(k) - 1; render(); }
    else if (k === "[") choosePanel(state.panel - 1);
    else if (k === "]") choosePanel(state.panel + 1);
    else return;
    e.preventDefault();
  });
  let resizeTimer = null;
  window.addEventListener("resize", () => { clearTimeout(resizeTimer); resizeTimer = setTimeout(redrawCharts, 60); });

  // ---- start ------------------------------------------------------------------------------
  api.zoomTo = (a, b) => { state.x0 = a; state.x1 = b; redrawCharts(); };
  api.showPeak = showPeak;
  api.choosePanel = choosePanel;
  resetView();
  renderCompare();
  render();
  api.ready = true;
  api.firstPaint = performance.now();
})();
