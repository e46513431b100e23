/* agentrl view: the report's drawing code (inline in the page; no library, no network).
   The data is the JSON block #data (reporting/view.py); every text from it is set with
   textContent, never parsed as HTML. */
"use strict";
const DATA = JSON.parse(document.getElementById("data").textContent);
const SVGNS = "http://www.w3.org/2000/svg";
const COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
                "#7f7f7f", "#bcbd22", "#17becf"];
const DASHES = [null, "6 3", "2 3", "8 3 2 3", "1 4"];

/* ------------------------------------------------------------------ elements */

function setAttrs(e, attrs) {
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (k === "text") e.textContent = v;
    else e.setAttribute(k, v);
  }
}

function addKids(e, kids) {
  for (const k of kids.flat(Infinity)) {
    if (k === null || k === undefined || k === false) continue;
    e.append(k instanceof Node ? k : String(k));
  }
  return e;
}

function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  setAttrs(e, attrs);
  return addKids(e, kids);
}

function sv(tag, attrs, ...kids) {
  const e = document.createElementNS(SVGNS, tag);
  setAttrs(e, attrs);
  return addKids(e, kids);
}

function num(x, d = 3) {
  return x === null || x === undefined || !Number.isFinite(Number(x)) ? "–" : Number(x).toFixed(d);
}

function signed(x, d = 3) {
  return x === null || x === undefined ? "–" : (x >= 0 ? "+" : "") + Number(x).toFixed(d);
}

function withSe(x, se) {
  return num(x) + (se === null || se === undefined ? "" : " ± " + num(se));
}

function kvTable(pairs) {
  return el("table", {class: "kv"}, pairs.filter(p => p).map(([k, v]) =>
    el("tr", {}, el("th", {text: k}), el("td", {}, v instanceof Node ? v : String(v)))));
}

function selectBox(id, options, chosen, onchange) {
  const s = el("select", {id: id, onchange: () => onchange(s.value)},
    options.map(([value, label]) => el("option", {value: value, text: label})));
  s.value = String(chosen);
  return s;
}

function isLeaf(nd) { return nd.reward !== null && nd.reward !== undefined; }

function clamp01(x) { return Math.max(0, Math.min(1, x)); }

function mix(a, b, t) {
  const p = h => [1, 3, 5].map(i => parseInt(h.slice(i, i + 2), 16));
  const [x, y] = [p(a), p(b)];
  return "rgb(" + x.map((v, i) => Math.round(v + (y[i] - v) * clamp01(t))).join(",") + ")";
}

/* ------------------------------------------------------------------ charts */

function niceTicks(lo, hi, n = 5) {
  const raw = (hi - lo) / n, mag = Math.pow(10, Math.floor(Math.log10(raw)));
  const step = [1, 2, 2.5, 5, 10].map(m => m * mag).find(s => s >= raw);
  const out = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step)
    out.push(Number(v.toPrecision(12)));
  return out;
}

function lowest(xs, start = Infinity) { return xs.reduce((a, b) => (b < a ? b : a), start); }

function highest(xs, start = -Infinity) { return xs.reduce((a, b) => (b > a ? b : a), start); }

function domain(values, pad = 0.05) {
  const v = values.filter(Number.isFinite);
  if (!v.length) return [0, 1];
  let lo = lowest(v), hi = highest(v);
  if (lo === hi) { const w = Math.abs(lo) * 0.5 || 0.5; lo -= w; hi += w; }
  const p = (hi - lo) * pad;
  return [lo - p, hi + p];
}

function tickLabel(v) {
  const a = Math.abs(v);
  return a !== 0 && (a >= 1e5 || a < 1e-3) ? v.toExponential(1) : String(Number(v.toPrecision(4)));
}

/* An SVG frame with axes: {svg, X, Y}. opts: width, height, x, y (domains), xLabel, yLabel,
   xTicks ([[value, label]], else numeric ticks). */
function frame(opts) {
  const W = opts.width || 460, H = opts.height || 230, m = {l: 54, r: 12, t: 8, b: 38};
  const [x0, x1] = opts.x, [y0, y1] = opts.y;
  const X = v => m.l + (v - x0) / (x1 - x0 || 1) * (W - m.l - m.r);
  const Y = v => H - m.b - (v - y0) / (y1 - y0 || 1) * (H - m.t - m.b);
  const svg = sv("svg", {width: W, height: H, viewBox: `0 0 ${W} ${H}`});
  const grid = sv("g", {class: "grid"}), axis = sv("g", {class: "axis"});
  for (const t of niceTicks(y0, y1, 4)) {
    grid.append(sv("line", {x1: m.l, x2: W - m.r, y1: Y(t), y2: Y(t)}));
    axis.append(sv("text", {x: m.l - 5, y: Y(t) + 4, "text-anchor": "end", text: tickLabel(t)}));
  }
  const xt = opts.xTicks || niceTicks(x0, x1, 6).map(t => [t, tickLabel(t)]);
  for (const [t, label] of xt)
    axis.append(sv("text", {x: X(t), y: H - m.b + 15, "text-anchor": "middle", text: label}));
  axis.append(sv("line", {x1: m.l, x2: W - m.r, y1: H - m.b, y2: H - m.b}),
              sv("line", {x1: m.l, x2: m.l, y1: m.t, y2: H - m.b}),
              sv("text", {x: (m.l + W - m.r) / 2, y: H - 4, "text-anchor": "middle", text: opts.xLabel || ""}),
              sv("text", {x: 12, y: (m.t + H - m.b) / 2, "text-anchor": "middle",
                          transform: `rotate(-90 12 ${(m.t + H - m.b) / 2})`, text: opts.yLabel || ""}));
  svg.append(grid, axis);
  return {svg, X, Y, W, H, m};
}

function legend(items) {
  return el("div", {class: "legend"}, items.map(it => el("span", {},
    el("span", {class: "sw", style: `background:${it.color};${it.dash ? "height:1px;border-top:2px dashed " + it.color + ";background:none" : ""}`}),
    it.name)));
}

function drawSeries(f, s) {
  const g = sv("g", {class: "series"});
  if (s.band && s.band.length > 1) {
    const up = s.band.map(([x, , hi]) => `${f.X(x)},${f.Y(hi)}`);
    const down = s.band.slice().reverse().map(([x, lo]) => `${f.X(x)},${f.Y(lo)}`);
    g.append(sv("polygon", {points: up.concat(down).join(" "), fill: s.color, "fill-opacity": 0.15, stroke: "none"}));
  }
  for (const [x, lo, hi] of s.errors || [])
    g.append(sv("line", {x1: f.X(x), x2: f.X(x), y1: f.Y(lo), y2: f.Y(hi), stroke: s.color, "stroke-width": 1.2}));
  if (s.points.length > 1 && !s.noLine)
    g.append(sv("polyline", {points: s.points.map(([x, y]) => `${f.X(x)},${f.Y(y)}`).join(" "),
      fill: "none", stroke: s.color, "stroke-width": s.width || 1.6, "stroke-dasharray": s.dash}));
  if (s.markers || s.points.length === 1)
    for (const [x, y, tip] of s.points)
      g.append(sv("circle", {cx: f.X(x), cy: f.Y(y), r: s.r || 3, fill: s.color},
        sv("title", {text: tip || `${s.name}: step ${x}, ${num(y, 4)}`})));
  return g;
}

/* A line chart. opts: title, xLabel, yLabel, series [{name, color, points [[x, y, tip?]], dash,
   width, band [[x, lo, hi]], errors [[x, lo, hi]], markers}], hlines [{y, name, color}],
   yDomain, xTicks, id, width, height. */
function lineChart(opts) {
  const xs = opts.series.flatMap(s => s.points.map(p => p[0]));
  const ys = opts.series.flatMap(s => s.points.map(p => p[1]).concat((s.band || s.errors || []).flatMap(b => [b[1], b[2]])))
    .concat((opts.hlines || []).map(h => h.y));
  const f = frame({...opts, x: opts.xDomain || domain(xs, 0.02), y: opts.yDomain || domain(ys)});
  for (const h of opts.hlines || [])
    f.svg.append(sv("line", {x1: f.m.l, x2: f.W - f.m.r, y1: f.Y(h.y), y2: f.Y(h.y), stroke: h.color || "#555555",
                             "stroke-dasharray": "5 4", "stroke-width": 1.2}, sv("title", {text: `${h.name}: ${num(h.y)}`})));
  for (const s of opts.series) f.svg.append(drawSeries(f, s));
  const items = opts.series.filter(s => s.name).concat((opts.hlines || []).map(h => ({...h, color: h.color || "#555555", dash: true})));
  return el("figure", {class: "chart", id: opts.id}, el("figcaption", {text: opts.title || ""}), f.svg,
            items.length > 1 || opts.legend ? legend(items) : null);
}

/* A bar chart. opts: title, bars [{label, value, tip}], yLabel, color, id. */
function barChart(opts) {
  const n = opts.bars.length, W = Math.max(220, 60 + n * 46);
  const f = frame({width: W, height: 180, x: [-0.5, n - 0.5], y: [0, highest(opts.bars.map(b => b.value), 1) * 1.08],
                   xTicks: opts.bars.map((b, i) => [i, b.label]), yLabel: opts.yLabel, xLabel: opts.xLabel});
  opts.bars.forEach((b, i) => {
    const w = Math.min(34, (f.X(1) - f.X(0)) * 0.7);
    f.svg.append(sv("rect", {class: "bar", x: f.X(i) - w / 2, y: f.Y(b.value), width: w, height: f.Y(0) - f.Y(b.value),
                             fill: opts.color || "#6baed6"}, sv("title", {text: b.tip || `${b.label}: ${b.value}`})));
  });
  return el("figure", {class: "chart", id: opts.id}, el("figcaption", {text: opts.title || ""}), f.svg);
}

/* ------------------------------------------------------------------ run: header and curves */

function runHeader(d) {
  const s = d.summary || {}, done = d.metrics.length ? d.metrics[d.metrics.length - 1].step : 0;
  const traced = d.traced_steps.length;
  return el("div", {},
    el("h1", {text: `agentrl run ${d.name}`}),
    el("div", {class: "muted", text: `${d.method || "?"} on ${d.env || "?"} · model ${d.model || "?"} · seed ${d.seed ?? "?"} · ` +
      `step ${done} of ${d.steps ?? "?"} · ${d.path}`}),
    el("p", {}, kvTable([
      Number.isFinite(s.base_success) && ["held-out success", `${withSe(s.base_success, s.base_success_se)} (base) → ` +
                                       `${withSe(s.final_success, s.final_success_se)} (final)`],
      Number.isFinite(s.tokens_generated) && ["tokens generated in training", s.tokens_generated.toLocaleString()],
      ["traced steps", traced ? `${traced} (every ${d.trace_every ?? "?"} steps, first and last); ${d.traces.length} in this report` :
        "none (train.trace_every=0, or a run of an older build): curves only"],
      ["in the terminal", el("code", {text: `agentrl view ${d.path} --text --step N --tree K`})],
    ])));
}

/* What could not be read (reporting/folder_reader.py): one row per file and reason. */
function problemsSection(d) {
  const sec = el("section", {id: "problems"});
  if (!(d.problems || []).length) return sec;
  return addKids(sec, [el("h2", {text: "Could not read"}),
    el("div", {class: "small muted", text: "These files of the folder were skipped; the rest of the report is drawn without them."}),
    el("table", {class: "kv", id: "problems-table"}, el("tr", {}, el("th", {text: "file"}), el("th", {text: "reason"})),
      d.problems.map(p => el("tr", {}, el("td", {class: "mono", text: p.file}), el("td", {text: p.reason})))),
    d.problems_left_out ? el("p", {class: "muted", text: `and ${d.problems_left_out} more`}) : null]);
}

/* A part of the page built by `build`; if it fails, a note in its place and the rest drawn. */
function guarded(id, title, build) {
  try {
    return build();
  } catch (e) {
    return el("section", {id: id, class: "broken"}, el("h2", {text: title}),
      el("p", {class: "warn", text: `This part could not be drawn: ${e && e.message ? e.message : e}`}));
  }
}

/* Fill `box` with what `draw` builds; if it fails, a note in the box. */
function drawInto(box, what, draw) {
  try {
    draw();
  } catch (e) {
    box.replaceChildren(el("p", {class: "warn", text: `This ${what} could not be drawn: ${e && e.message ? e.message : e}`}));
  }
}

function metricKeys(rows) {
  const keys = new Set();
  for (const r of rows) for (const k of Object.keys(r)) if (k !== "step") keys.add(k);
  return [...keys].sort();
}

function metricChart(rows, key, d) {
  const pts = rows.filter(r => Number.isFinite(r[key])).map(r => [r.step, r[key]]);
  const series = [{name: key, color: COLORS[0], points: pts, markers: pts.length < 40}];
  const hlines = [];
  let yDomain = null;
  if (key === "eval/success") {
    const se = rows.filter(r => Number.isFinite(r[key]) && Number.isFinite(r["eval/success_se"]))
      .map(r => [r.step, r[key] - r["eval/success_se"], r[key] + r["eval/success_se"]]);
    series[0].band = se;
    series[0].errors = se;
    series[0].name = "held-out success ± se";
    series[0].markers = true;
    const base = rows.find(r => r.step === 0 && Number.isFinite(r[key]));
    const b = base ? base[key] : (d.summary || {}).base_success;
    if (Number.isFinite(b)) hlines.push({y: b, name: "base", color: "#555555"});
    yDomain = [0, 1];
  } else if (key === "success") yDomain = [0, 1];
  return lineChart({title: key, xLabel: "step", yLabel: key, series, hlines, yDomain, legend: key === "eval/success",
                    id: "chart-" + key.replace(/[^\w]/g, "_")});
}

function curvesSection(d) {
  const sec = el("section", {id: "curves"}, el("h2", {text: "Learning curves"}));
  const keys = metricKeys(d.metrics).filter(k => k !== "eval/success_se");
  if (!keys.length) return addKids(sec, [el("p", {class: "muted", text: "metrics.jsonl has no rows yet."})]);
  const chosen = new Set(["eval/success", "reward/mean", "rollout/tool_calls"].filter(k => keys.includes(k)));
  if (!chosen.size) chosen.add(keys[0]);
  const charts = el("div", {class: "row", id: "curve-charts"});
  const redraw = () => charts.replaceChildren(...keys.filter(k => chosen.has(k)).map(k => metricChart(d.metrics, k, d)));
  const groups = {};
  for (const k of keys) (groups[k.includes("/") ? k.split("/")[0] : "other"] ||= []).push(k);
  const picker = el("div", {class: "keys", id: "metric-picker"}, Object.entries(groups).map(([g, ks]) => el("div", {class: "keygroup"},
    el("div", {class: "group", text: g}),
    ks.map(k => el("label", {}, el("input", {type: "checkbox", value: k, checked: chosen.has(k) ? "checked" : null,
      onchange: e => { e.target.checked ? chosen.add(k) : chosen.delete(k); redraw(); }}), " " + k)))));
  redraw();
  return addKids(sec, [el("div", {class: "small muted", text: "Every scalar of metrics.jsonl; tick the ones to draw " +
    "(eval/success: the held-out checks with their task-clustered standard error as band and bars, the base model dashed)."}),
    picker, charts]);
}

/* ------------------------------------------------------------------ FOCUS trees */

function treeLayout(nodes) {
  const x = new Array(nodes.length).fill(0);
  let next = 0, depth = 0;
  const visit = id => {
    const kids = nodes[id].children || [];
    depth = Math.max(depth, nodes[id].depth);
    if (!kids.length) { x[id] = next++; return; }
    kids.forEach(visit);
    x[id] = kids.reduce((s, c) => s + x[c], 0) / kids.length;
  };
  if (nodes.length) visit(0);
  return {x, leaves: next, depth};
}

function nodeColour(nd, mode) {
  if (isLeaf(nd)) return mix("#de2d26", "#31a354", nd.reward);
  if (mode === "vtilde") return nd.V_tilde === null ? "#cccccc" : mix("#f7fbff", "#08519c", nd.V_tilde);
  if (nd.v === null || nd.cbar === null) return "#cccccc";
  return mix("#fff5eb", "#d94801", Math.abs(nd.v - nd.cbar) * 2);
}

function nodeTip(nd) {
  if (isLeaf(nd)) return `node ${nd.id} · leaf · reward ${num(nd.reward, 2)}`;
  return `node ${nd.id} · depth ${nd.depth} · v ${num(nd.v)} · Ṽ ${num(nd.V_tilde)} · n ${nd.n} · c̄ ${num(nd.cbar)}` +
         (nd.launched ? ` · launched ${nd.launched}` : "");
}

function drawTree(tree, mode, selected, onPick) {
  const nodes = tree.nodes, L = treeLayout(nodes), gapY = 64;
  const W = Math.max(520, 90 + L.leaves * 26), H = (L.depth + 1) * gapY + 30;
  const X = i => 70 + (L.leaves > 1 ? L.x[i] / (L.leaves - 1) : 0.5) * (W - 100);
  const Y = i => 22 + nodes[i].depth * gapY;
  const svg = sv("svg", {width: W, height: H, id: "tree-svg", "data-nodes": nodes.length});
  for (let k = 0; k <= L.depth; k++)
    svg.append(sv("text", {x: 4, y: 26 + k * gapY, class: "muted", text: `depth ${k}`}));
  for (const nd of nodes)
    if (nd.parent >= 0) svg.append(sv("line", {class: "edge", x1: X(nd.parent), y1: Y(nd.parent), x2: X(nd.id), y2: Y(nd.id)}));
  for (const nd of nodes) {
    const r = Math.min(18, 4 + 2.5 * Math.sqrt(Math.max(1, nd.n || 1)));
    const cls = "node" + (nd.launched ? " launcher" : "") + (nd.id === selected ? " selected" : "") + (isLeaf(nd) ? " leaf" : "");
    const attrs = {class: cls, fill: nodeColour(nd, mode), "data-id": nd.id, onclick: () => onPick(nd.id)};
    const shape = isLeaf(nd)
      ? sv("rect", {...attrs, x: X(nd.id) - r * 0.8, y: Y(nd.id) - r * 0.8, width: r * 1.6, height: r * 1.6})
      : sv("circle", {...attrs, cx: X(nd.id), cy: Y(nd.id), r: r});
    shape.append(sv("title", {text: nodeTip(nd)}));
    svg.append(shape);
  }
  return svg;
}

function ancestry(nodes, id) {
  const out = [];
  for (let i = id; i >= 0; i = nodes[i].parent) out.push(i);
  return out.reverse();
}

function leafRewards(nodes, id) {
  const out = [], stack = [id];
  while (stack.length) {
    const nd = nodes[stack.pop()];
    if (isLeaf(nd)) out.push(nd.reward);
    stack.push(...(nd.children || []));
  }
  return out;
}

function stateText(tree, id) {
  const div = el("div", {class: "state", id: "node-state"}, el("span", {class: "q", text: "question: " + (tree.question || "")}), "\n");
  for (const i of ancestry(tree.nodes, id).slice(1)) {
    const n = tree.nodes[i];
    div.append(el("span", {class: "act"}, "→ ", el("span", {class: i === id ? "state-action" : "", text: n.action ?? ""})), "\n");
    if (n.observation) div.append(el("span", {class: "obs", text: "← " + n.observation}), "\n");
  }
  const nd = tree.nodes[id];
  if (isLeaf(nd)) div.append(el("span", {class: "q", text: `model answer: ${nd.model_answer || "–"} · gold: ${tree.gold_answer ?? "–"}`}));
  return div;
}

function countValues(xs) {
  const c = {};
  for (const x of xs) c[num(x, 2)] = (c[num(x, 2)] || 0) + 1;
  return Object.entries(c).map(([k, v]) => `${k} ×${v}`).join(", ");
}

function nodeDetail(tree, id, trace, pick, showEpisode) {
  const nd = tree.nodes[id], leaves = leafRewards(tree.nodes, id);
  const rowIndex = trace.episodes.findIndex(e => e.row === nd.row);
  const link = (i, text) => el("span", {class: "link", onclick: () => pick(i), text: text});
  return [
    el("h3", {text: `node ${id} · depth ${nd.depth} · ${isLeaf(nd) ? "leaf" : "inner node"} · path ${nd.path}`}),
    stateText(tree, id),
    kvTable([
      isLeaf(nd) ? ["reward R", num(nd.reward)] : null,
      !isLeaf(nd) ? ["v (critic)", num(nd.v)] : null,
      !isLeaf(nd) ? ["Ṽ (refined)", num(nd.V_tilde)] : null,
      !isLeaf(nd) ? ["Ḡ (backed up)", num(nd.G_bar)] : null,
      ["n (own samples)", nd.n], !isLeaf(nd) ? ["c̄ (their mean)", num(nd.cbar)] : null,
      !isLeaf(nd) ? ["gain g", num(nd.g, 4)] : null,
      ["continuations launched", nd.launched ? `${nd.launched} (launch order ${(nd.launch_order || []).map(r => "#" + r).join(", ")})` : "0"],
      ["advantage of the segment into it", signed(nd.advantage)],
      ["tool calls so far", nd.tool_calls],
      ["children", nd.children.length ? el("span", {}, nd.children.map((c, i) => [i ? ", " : "", link(c, String(c))])) : "none"],
      ["leaf rewards below", leaves.length ? `${countValues(leaves)} (mean ${num(leaves.reduce((a, b) => a + b, 0) / leaves.length)})` : "none"],
      ["episode", rowIndex >= 0 ? el("span", {class: "link", onclick: () => showEpisode(rowIndex), text: `episode ${rowIndex} (row ${nd.row})`})
                                : "not among the traced episodes"],
    ])];
}

function budgetBars(list, title, id) {
  return barChart({title, id, yLabel: "tokens", xLabel: "depth launched from", bars: (list || []).map(b => ({
    label: b.depth === null ? "roots" : String(b.depth), value: b.tokens,
    tip: `${b.depth === null ? "root paths" : "continuations from depth " + b.depth}: ${b.paths} paths, ${b.tokens} tokens`}))});
}

function treePanel(trace, box, view, showEpisode) {
  const tree = trace.trees[view.tree];
  const detail = el("div", {class: "detail", id: "node-detail"});
  const wrap = el("div", {class: "tree-wrap", id: "tree"});
  const pick = id => {
    view.node = id;
    wrap.replaceChildren(drawTree(tree, view.colour, id, pick));
    detail.replaceChildren(...nodeDetail(tree, id, trace, pick, showEpisode));
  };
  const conts = tree.nodes.reduce((s, n) => s + (n.launched || 0), 0);
  const controls = el("div", {class: "controls"},
    el("label", {}, "tree ", selectBox("tree-select", trace.trees.map((t, i) =>
      [i, `${i}: ${t.task_id} · ${t.nodes.length} nodes`]), view.tree, v => { view.tree = +v; view.node = 0; treePanel(trace, box, view, showEpisode); })),
    el("span", {}, "colour: ", ["residual", "vtilde"].map(m => el("label", {}, el("input", {type: "radio", name: "colour", value: m,
      checked: view.colour === m ? "checked" : null, onchange: () => { view.colour = m; treePanel(trace, box, view, showEpisode); }}),
      m === "residual" ? " |v − c̄| " : " Ṽ "))));
  box.replaceChildren(controls,
    el("div", {class: "small muted", text: `${tree.task_id}: ${tree.nodes.length} nodes, ${Object.keys(tree.paths || {}).length} paths, ` +
      `${conts} continuations. Rows are depths; size: evidence n; inner nodes coloured by ${view.colour === "residual" ? "|v − c̄| (white 0, orange ≥ 0.5)" : "Ṽ (white 0, blue 1)"}` +
      "; leaves are squares, red (reward 0) to green (1); a thick outline: continuations were launched from it. Click a node."}),
    el("div", {class: "row"}, wrap, detail),
    el("div", {class: "row"}, budgetBars(tree.budget_by_depth, "where this tree's tokens went, by the depth a path was launched from", "budget-tree"),
       budgetBars(trace.budget_by_depth, `the whole step (${trace.trees_in_step} trees)`, "budget-step")));
  pick(Math.min(view.node, tree.nodes.length - 1));
}

/* ------------------------------------------------------------------ episodes */

function advColour(a, scale) {
  if (!a) return "rgba(255,215,80,0.35)";
  const t = 0.15 + 0.6 * Math.min(1, Math.abs(a) / (scale || 1));
  return a > 0 ? `rgba(49,163,84,${t})` : `rgba(222,45,38,${t})`;
}

function tokenView(ep) {
  const scale = highest(ep.advantages.map(a => Math.abs(a || 0)), 1e-9);
  const box = el("div", {class: "tokens", id: "tokens"});
  ep.tokens.forEach((t, i) => {
    const m = ep.response_mask[i];
    const s = el("span", {class: m ? "tok trained" : "tok",
      title: m ? `trained · advantage ${signed(ep.advantages[i], 4)}` : "not trained (prompt or env tokens)"}, t);
    if (m) s.style.background = advColour(ep.advantages[i], scale);
    box.append(s);
  });
  return box;
}

function episodePanel(trace, box, view) {
  const eps = trace.episodes, ep = eps[view.episode];
  const turns = el("table", {class: "kv turns"}, el("tr", {}, ["turn", "policy action", "tool", "observation", "advantage"].map(h => el("th", {text: h}))),
    ep.turns.map((t, i) => el("tr", {}, el("td", {text: i}), el("td", {class: "mono", text: t.action}), el("td", {text: t.tool || "–"}),
      el("td", {class: "mono", text: t.observation || ""}), el("td", {text: t.advantage === null ? "not trained here" : signed(t.advantage)}))));
  box.replaceChildren(
    el("div", {class: "controls"}, el("label", {}, "episode ", selectBox("episode-select", eps.map((e, i) =>
      [i, `${i}: ${e.task_id} · R ${num(e.reward, 2)} · ${e.turns.length} turns` + (e.path !== null ? ` · path ${e.path}` : "")]),
      view.episode, v => { view.episode = +v; episodePanel(trace, box, view); }))),
    kvTable([["question", ep.question], ["gold answer", ep.gold_answer], ["model answer", ep.model_answer || "–"],
      ["reward", `${num(ep.reward)} (${ep.success ? "success" : "failure"}, ${ep.finish})`],
      ["tool calls", ep.num_tool_calls], ["tokens", `${ep.tokens.length} shown, ${ep.trained_tokens} trained (response mask)` +
        (ep.tokens_left_out ? `, ${ep.tokens_left_out} more not kept` : "")],
      ep.path !== null ? ["FOCUS path", `path ${ep.path}, launched from node ${ep.origin}`] : null]),
    turns,
    el("div", {class: "small"}, "Every token: ", el("span", {class: "swatch", style: "background:rgba(49,163,84,0.6)"}), "trained, advantage > 0",
      el("span", {class: "swatch", style: "background:rgba(222,45,38,0.6)"}), "trained, advantage < 0",
      el("span", {class: "swatch", style: "background:rgba(255,215,80,0.35)"}), "trained, advantage 0",
      el("span", {class: "swatch", style: "background:#ffffff"}), "not trained (prompt, env). Hover a token for its advantage."),
    tokenView(ep));
}

function tracesSection(d) {
  const sec = el("section", {id: "traces"}, el("h2", {text: "Trees and episodes"}));
  if (!d.traces.length)
    return addKids(sec, [el("p", {class: "muted", text: "This run kept no traces (train.trace_every=0, or a run of an older build)."})]);
  const view = {trace: d.traces.length - 1, tree: 0, node: 0, colour: "residual", episode: 0};
  const treeBox = el("div", {id: "tree-view"}), epBox = el("div", {id: "episode-view"});
  const showEpisode = i => { view.episode = i; drawInto(epBox, "episode", () => episodePanel(d.traces[view.trace], epBox, view)); epBox.scrollIntoView(); };
  const show = () => {
    const t = d.traces[view.trace];
    if (t.trees.length) drawInto(treeBox, "tree", () => treePanel(t, treeBox, view, showEpisode));
    else treeBox.replaceChildren(el("p", {class: "muted", text: t.trees_in_step ? "This step's trees were left out (size cap)." :
      "This step has no trees (a method without tree search)."}));
    if (t.episodes.length) drawInto(epBox, "episode", () => episodePanel(t, epBox, view));
    else epBox.replaceChildren(el("p", {class: "muted", text: "No episodes kept for this step."}));
  };
  const stepSel = selectBox("step-select", d.traces.map((t, i) => [i, `step ${t.step}`]), view.trace,
    v => { view.trace = +v; view.tree = 0; view.node = 0; view.episode = 0; show(); });
  show();
  return addKids(sec, [el("div", {class: "controls"}, el("label", {}, "traced step ", stepSel),
    el("span", {class: "small muted", text: "each trace keeps the step's first trees and up to 12 of their episodes"})),
    el("h3", {text: "FOCUS tree"}), treeBox, el("h3", {text: "Episode: every token, coloured by whether a loss trains on it"}), epBox]);
}

/* ------------------------------------------------------------------ critic and behaviour */

function calibrationChart(traces, which) {
  const pick = which === "all" ? traces : [traces[+which]];
  const pts = pick.flatMap(t => (t.critic.v || []).map((v, i) => [v, t.critic.outcome[i], t.critic.leaves[i], t.critic.depth[i], t.step]));
  const byDepth = {};
  for (const p of pts) (byDepth[p[3]] ||= []).push(p);
  const unit = pick[0].critic.source === "turn values" ? "turn" : "depth";
  const series = Object.entries(byDepth).map(([dep, ps], i) => ({name: `${unit} ${dep}`, color: COLORS[i % COLORS.length], noLine: true,
    markers: true, r: 2.5, points: ps.map(p => [p[0], p[1], `step ${p[4]} · ${unit} ${p[3]}: v ${num(p[0])}, outcome ${num(p[1])} over ${p[2]} leaves`])}));
  const bins = Array.from({length: 10}, () => [0, 0, 0]);
  for (const [v, o] of pts) {
    if (!Number.isFinite(v) || !Number.isFinite(o)) continue;
    const b = bins[Math.min(9, Math.max(0, Math.floor(v * 10)))];
    b[0] += v; b[1] += o; b[2]++;
  }
  series.push({name: "mean outcome per v decile", color: "#111111", width: 2, markers: true,
               points: bins.filter(b => b[2]).map(b => [b[0] / b[2], b[1] / b[2], `${b[2]} points`])});
  series.push({name: "calibrated (outcome = v)", color: "#999999", dash: "4 3", points: [[0, 0], [1, 1]]});
  const vs = pts.map(p => p[0]).filter(Number.isFinite);
  const xDomain = [lowest(vs, 0), highest(vs, 1)];
  return lineChart({title: `critic value v against the outcome (${pts.length} points)`, xLabel: "v (critic)",
    yLabel: "outcome", series, xDomain, yDomain: [0, 1], legend: true, id: "calibration", width: 520, height: 300});
}

function criticSection(d) {
  const sec = el("section", {id: "critic"}, el("h2", {text: "Critic and behaviour"}));
  const traces = d.traces.filter(t => t.critic && (t.critic.v || []).length);
  if (traces.length) {
    const src = traces[0].critic.source;
    const box = el("div", {id: "calibration-box"});
    const draw = w => box.replaceChildren(calibrationChart(traces, w));
    addKids(sec, [el("div", {class: "controls"}, el("label", {}, "traced step ", selectBox("critic-step",
      [["all", "all traced steps"]].concat(traces.map((t, i) => [i, `step ${t.step}`])), "all", draw))),
      el("div", {class: "small muted", text: src === "tree nodes" ? "Each inner node of every tree of a traced step: the critic's value " +
        "v(s) against the mean reward of the leaves below it." : "The critic's value before each turn against the episode's reward."}), box]);
    draw("all");
  } else addKids(sec, [el("p", {class: "muted", text: "No critic values recorded (a method without a critic, or no traces)."})]);
  const rows = d.metrics;
  const series = [["rollout/tool_calls", "training episodes"], ["eval/tool_calls", "held-out checks"]]
    .map(([k, name], i) => ({name, color: COLORS[i], markers: true, points: rows.filter(r => Number.isFinite(r[k])).map(r => [r.step, r[k]])}))
    .filter(s => s.points.length);
  if (series.length)
    sec.append(lineChart({title: "tool calls per episode", xLabel: "step", yLabel: "tool calls", series, legend: true, id: "tool-calls"}));
  return sec;
}

/* ------------------------------------------------------------------ sweeps */

function finalOf(run) {
  const s = run.summary || {};
  if (Number.isFinite(s.final_success)) return s.final_success;
  const ev = run.metrics.filter(r => Number.isFinite(r["eval/success"]));
  return ev.length ? ev[ev.length - 1]["eval/success"] : null;
}

function sweepCurves(d, key) {
  const series = [];
  d.cells.forEach((c, ci) => {
    const color = COLORS[ci % COLORS.length];
    c.runs.forEach((r, si) => series.push({name: `${c.name} seed ${r.seed}`, color, dash: DASHES[si % DASHES.length], width: 1,
      points: r.metrics.filter(m => Number.isFinite(m[key])).map(m => [m.step, m[key], `${c.name} seed ${r.seed}: step ${m.step}, ${num(m[key], 4)}`])}));
    const common = c.runs.map(r => new Map(r.metrics.filter(m => Number.isFinite(m[key])).map(m => [m.step, m[key]])));
    const steps = common.length ? [...common[0].keys()].filter(s => common.every(m => m.has(s))) : [];
    if (c.runs.length > 1 && steps.length)
      series.push({name: `${c.name} (mean)`, color, width: 3, points: steps.map(s => [s, common.reduce((a, m) => a + m.get(s), 0) / common.length])});
  });
  return lineChart({title: `${key} per cell and seed (thick: the mean over seeds)`, xLabel: "step", yLabel: key, series,
                    legend: true, id: "sweep-curves", width: 720, height: 300, yDomain: key === "eval/success" ? [0, 1] : null});
}

function finalVsParam(d, axis) {
  const label = c => axis === "method" ? c.method : c.params[axis];
  const labels = [...new Set(d.cells.map(label))];
  const numeric = labels.every(l => l !== undefined && l !== "" && Number.isFinite(Number(l)));
  const pos = l => numeric ? Number(l) : labels.indexOf(l);
  const groups = {};
  for (const c of d.cells) {
    const rest = [axis === "method" ? "" : c.method].concat(Object.entries(c.params).filter(([k]) => k !== axis).map(([k, v]) => `${k}=${v}`)).join(" ").trim() || "all";
    (groups[rest] ||= []).push(c);
  }
  const series = Object.entries(groups).flatMap(([g, cs], i) => {
    const color = COLORS[i % COLORS.length];
    const seeds = cs.flatMap(c => c.runs.map(r => [pos(label(c)), finalOf(r), `${c.name} seed ${r.seed}: ${num(finalOf(r))}`])).filter(p => Number.isFinite(p[1]));
    const means = cs.map(c => { const v = c.runs.map(finalOf).filter(Number.isFinite);
      return v.length ? [pos(label(c)), v.reduce((a, b) => a + b, 0) / v.length, `${c.name}: mean ${num(v.reduce((a, b) => a + b, 0) / v.length)} over ${v.length} seeds`] : null; })
      .filter(p => p).sort((a, b) => a[0] - b[0]);
    return [{name: `${g} (seeds)`, color, noLine: true, markers: true, r: 3, points: seeds},
            {name: `${g} (mean)`, color, width: 2, markers: true, r: 5, points: means}];
  });
  const xs = labels.map(pos);
  return lineChart({title: `final held-out success vs ${axis}`, xLabel: axis, yLabel: "final held-out success", series, legend: true,
    xDomain: numeric ? domain(xs, 0.08) : [-0.5, labels.length - 0.5], yDomain: [0, 1], id: "final-vs-" + axis.replace(/[^\w]/g, "_"),
    xTicks: numeric ? null : labels.map((l, i) => [i, String(l)])});
}

function sweepTable(d) {
  return el("table", {class: "kv", id: "cells"}, el("tr", {}, ["cell", "method", "parameters", "seed", "final held-out success", "base",
    "tokens generated", "run folder"].map(h => el("th", {text: h}))),
    d.cells.flatMap(c => c.runs.map(r => el("tr", {}, el("td", {text: c.name}), el("td", {text: c.method || "–"}),
      el("td", {text: Object.entries(c.params).map(([k, v]) => `${k}=${v}`).join(" ") || "–"}), el("td", {text: r.seed}),
      el("td", {text: withSe(finalOf(r), (r.summary || {}).final_success_se)}), el("td", {text: num((r.summary || {}).base_success)}),
      el("td", {text: (r.summary || {}).tokens_generated ?? "–"}), el("td", {}, el("code", {text: `agentrl view ${r.path}`}))))));
}

function sweepCurvesSection(d) {
  const keys = [...new Set(d.cells.flatMap(c => c.runs.flatMap(r => metricKeys(r.metrics))))].filter(k => k !== "eval/success_se");
  const curveBox = el("div", {id: "sweep-curve-box"});
  const key0 = keys.includes("eval/success") ? "eval/success" : keys[0];
  const draw = k => drawInto(curveBox, "chart", () => curveBox.replaceChildren(k ? sweepCurves(d, k) : el("p", {class: "muted", text: "No metrics yet."})));
  draw(key0);
  return el("section", {id: "sweep"}, el("h2", {text: "Curves"}), el("div", {class: "controls"}, el("label", {}, "metric ",
    selectBox("sweep-metric", keys.map(k => [k, k]), key0, draw))), curveBox);
}

function renderSweep(d, app) {
  app.append(el("h1", {text: `agentrl ablate ${d.name}`}),
    el("div", {class: "muted", text: `${d.cells.length} cells · seeds ${(d.seeds || []).join(", ") || "?"} · budget ` +
      `${d.budget_tokens || "uncapped"} tokens/step · ${d.path}`}),
    guarded("problems", "Could not read", () => problemsSection(d)),
    guarded("sweep", "Curves", () => sweepCurvesSection(d)),
    guarded("final", "Final held-out success vs each swept parameter", () => el("section", {id: "final"},
      el("h2", {text: "Final held-out success vs each swept parameter"}),
      el("div", {class: "row"}, (d.axes.length ? d.axes : ["method"]).map(a => finalVsParam(d, a))))),
    guarded("cells", "Cells and seeds", () => el("section", {}, el("h2", {text: "Cells and seeds"}), sweepTable(d))));
}

/* ------------------------------------------------------------------ main */

function main() {
  const app = document.getElementById("app");
  if (DATA.kind === "sweep") renderSweep(DATA, app);
  else app.append(guarded("header", "Run", () => runHeader(DATA)), guarded("problems", "Could not read", () => problemsSection(DATA)),
    guarded("curves", "Learning curves", () => curvesSection(DATA)), guarded("traces", "Trees and episodes", () => tracesSection(DATA)),
    guarded("critic", "Critic and behaviour", () => criticSection(DATA)));
  document.body.setAttribute("data-ready", "1");
}

main();
