// Line charts in SVG: one chart per metric, one line per series (a run's stage), x = a step counter.
import { el } from "./dom.js";

export const COLORS = ["#2463c9", "#d1495b", "#1a7f37", "#9a6700", "#7b3fb5", "#00798c", "#c05621", "#4a5568"];
const NS = "http://www.w3.org/2000/svg";

function svg(tag, attrs = {}, text) {
  const node = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

const fmt = (v) => (Math.abs(v) >= 1000 || (Math.abs(v) < 0.01 && v !== 0) ? v.toExponential(2) : Number(v.toFixed(3)).toString());

// series: {name, run, stage, color, dash, points: [[x, y]]}; options: stage (the chart shows only that stage),
// xLabel (what x counts: "step", the global step, or "stage step", the step within its stage)
export function chart(title, series, key, { stage, xLabel = "step" } = {}) {
  const W = 400, H = 170, L = 52, R = 8, T = 8, B = 22;
  const xs = series.flatMap((s) => s.points.map((p) => p[0]));
  const ys = series.flatMap((s) => s.points.map((p) => p[1])).filter(Number.isFinite);
  let [x0, x1] = [Math.min(...xs), Math.max(...xs)];
  let [y0, y1] = [Math.min(...ys), Math.max(...ys)];
  if (x0 === x1) x1 = x0 + 1;
  if (y0 === y1) { y0 -= 0.5; y1 += 0.5; }
  const sx = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R);
  const sy = (y) => T + (1 - (y - y0) / (y1 - y0)) * (H - T - B);
  const plot = svg("svg", { viewBox: `0 0 ${W} ${H}`, "data-key": key, preserveAspectRatio: "none", ...(stage ? { "data-stage": stage } : {}) });
  plot.append(svg("line", { x1: L, y1: H - B, x2: W - R, y2: H - B, stroke: "#bbb" }), svg("line", { x1: L, y1: T, x2: L, y2: H - B, stroke: "#bbb" }));
  for (const [y, anchor] of [[y0, H - B], [y1, T + 8], [(y0 + y1) / 2, (H - B + T) / 2 + 4]]) {
    plot.append(svg("text", { x: L - 4, y: anchor, "text-anchor": "end", "font-size": 10, fill: "#66707a" }, fmt(y)));
  }
  plot.append(svg("text", { x: L, y: H - 6, "font-size": 10, fill: "#66707a" }, `${xLabel} ${x0}`));
  plot.append(svg("text", { x: W - R, y: H - 6, "text-anchor": "end", "font-size": 10, fill: "#66707a" }, `${x1}`));
  for (const s of series) {
    const points = s.points.filter((p) => Number.isFinite(p[1])).map((p) => `${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`).join(" ");
    const [first, last] = [s.points[0], s.points[s.points.length - 1]];
    const line = svg("polyline", { points, fill: "none", stroke: s.color, "stroke-width": 1.6, "stroke-dasharray": s.dash || "none",
      "data-run": s.run ?? s.name, "data-stage": s.stage ?? "", "data-points": s.points.length, "data-first": first[0], "data-last": last[0] });
    line.append(svg("title", {}, `${s.name}: last ${fmt(last[1])} at ${xLabel} ${last[0]}`));
    plot.append(line);
    if (s.points.length === 1) plot.append(svg("circle", { cx: sx(s.points[0][0]), cy: sy(s.points[0][1]), r: 3, fill: s.color }));
  }
  return el("div", { class: "chart" }, el("h4", {}, title), plot);
}
