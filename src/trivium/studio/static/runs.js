// Runs: every run folder under the root with its state; launch a config, stop a run; a run's live charts,
// resolved config, log and failures; several runs overlaid.
import { api, el, flash, query } from "./dom.js";
import { chart, COLORS } from "./charts.js";

// charts, in this order, for the metrics a run has (a key matches when it equals or ends with the pattern)
const GROUPS = [
  ["rewards", /^rollout\/reward_mean$|^rollout\/accuracy$/],
  ["eval accuracy", /^eval\/.*\/accuracy$/],
  ["losses", /^train\/(loss|pg_loss|policy_loss|sft_loss|dpo_loss|value_loss)$/],
  ["optimizer", /^train\/(grad_norm|lr)$/],
  ["KL", /kl/i],
  ["entropy", /entropy/],
  ["mismatch", /^mismatch\/logprob_abs_(mean|max)$/],
  ["staleness", /stale/],
  ["throughput", /tokens_per_s$/],
  ["task durations (s)", /^rollout\/(task_seconds_(p50|p95|max)|task_timeout_s)$/],
  ["long tail", /^rollout\/(timed_out_tasks|cancelled_tasks|unused_groups|in_flight_weight_loads|mixed_version_samples)$/],
  ["phase times (s)", /^(time\/.*|rollout\/seconds|train\/seconds|sync\/seconds|sync\/wait_seconds|buffer\/wait_seconds)$/],
];

function stateCell(run) {
  return el("span", { class: `state ${run.state}` }, run.state, run.resumable ? " (resumable)" : "");
}

export async function runsPage(page) {
  const configs = await api("/api/configs");
  const body = el("tbody");
  const pick = el("select", { id: "launch-config" }, configs.map((c) => el("option", { value: c.path }, c.name)));
  const extra = el("input", { id: "launch-overrides", size: 40, placeholder: "overrides, e.g. buffer.total_steps=4; name=try2" });
  page.append(
    el("div", { class: "panel row" }, el("strong", {}, "Launch"), pick, extra,
      el("button", { class: "primary", id: "launch", onclick: async () => {
        try {
          const overrides = extra.value.split(";").map((x) => x.trim()).filter(Boolean);
          const started = await api("/api/runs/launch", { json: { config: pick.value, overrides } });
          flash(`launched ${started.id} (pid ${started.pid})`, true);
          refresh();
        } catch (error) { flash(error.body && error.body.problems ? `${error.message}\n${error.body.problems.map((p) => `${p.path}: ${p.rule}`).join("\n")}` : error.message); }
      } }, "launch"),
      el("span", { class: "muted" }, "runs launched here are written under the Studio's root")),
    el("div", { class: "row" }, el("button", { id: "compare-selected", onclick: () => {
      const ids = [...document.querySelectorAll("input[data-compare]:checked")].map((x) => x.dataset.compare);
      location.hash = `#/compare?ids=${encodeURIComponent(ids.join(","))}`;
    } }, "compare selected")),
    el("table", {}, el("thead", {}, el("tr", {}, ["", "run", "state", "stage / step", "reward", "eval accuracy", "updated", ""].map((h) => el("th", {}, h)))), body));
  async function refresh() {
    const runs = await api("/api/runs");
    body.replaceChildren(...runs.map((run) => {
      const last = run.last || {};
      const acc = Object.entries(last).filter(([k]) => k.startsWith("eval/")).map(([k, v]) => `${k.split("/")[1]} ${v.toFixed(3)}`).join(", ");
      return el("tr", { "data-run": run.id },
        el("td", {}, el("input", { type: "checkbox", "data-compare": run.id })),
        el("td", {}, el("a", { href: `#/run?id=${encodeURIComponent(run.id)}` }, run.id)),
        el("td", {}, stateCell(run), run.error ? el("div", { class: "muted" }, run.error) : null),
        el("td", {}, last.stage ? `${last.stage} ${last.step}` : "–"),
        el("td", {}, last["rollout/reward_mean"] !== undefined ? last["rollout/reward_mean"].toFixed(3) : "–"),
        el("td", {}, acc || "–"),
        el("td", { class: "muted" }, run.updated ? new Date(run.updated * 1000).toLocaleTimeString() : ""),
        el("td", {}, run.state === "running" ? el("button", { "data-stop": run.id, onclick: () => stop(run.id, refresh) }, "stop") : null));
    }));
  }
  await refresh();
  const timer = setInterval(() => refresh().catch((e) => flash(e.message)), 2000);
  return () => clearInterval(timer);
}

async function stop(id, then) {
  try {
    await api(`/api/run/stop?id=${encodeURIComponent(id)}`, { method: "POST" });
    flash(`asked ${id} to stop: it ends after its current step, with a checkpoint`, true);
  } catch (error) { flash(error.message); }
  then();
}

const PREFERRED = ["time/step", "time/train", "time/rollout", "time/eval", "time/sync", "time/wait"];
const rank = (key) => (PREFERRED.includes(key) ? PREFERRED.indexOf(key) : PREFERRED.length);

// a run's stages use one colour, in line styles by their order: solid, dashed, dotted, dash-dot
const DASHES = ["", "6 3", "2 2", "8 3 2 3"];
const STYLE_NOTE = "a run's stages: solid first, then dashed, dotted, dash-dot";

function byStage(records) {
  // [[stage, records]] in the order the stages ran
  const stages = new Map();
  for (const r of records) {
    const stage = r.stage ?? "main";
    if (!stages.has(stage)) stages.set(stage, []);
    stages.get(stage).push(r);
  }
  return [...stages];
}

// x: "global_step" (the run's step counter across its stages) or "step" (the step within the stage).
// perStage: a metric recorded in several stages gets one chart per stage, each on its own scale (an SFT
// loss and a GRPO loss differ by orders of magnitude: on one scale the second is a flat line).
function chartsFor(runs, box, { x = "global_step", perStage = false } = {}) {
  box.replaceChildren();
  const keys = new Set(runs.flatMap(({ records }) => records.flatMap((r) => Object.keys(r))));
  const split = runs.map(({ id, records }, i) => ({ id, color: COLORS[i % COLORS.length], stages: byStage(records) }));
  const xLabel = x === "step" ? "stage step" : "step";
  for (const [title, pattern] of GROUPS) {
    // the keys a reader looks for first (PREFERRED), then the rest alphabetically, at most 6 charts a group
    const matching = [...keys].filter((k) => pattern.test(k)).sort((a, b) => rank(a) - rank(b) || a.localeCompare(b));
    for (const key of matching.slice(0, 6)) {
      const series = split.flatMap(({ id, color, stages }) => stages.map(([stage, records], j) => ({
        name: stages.length > 1 ? `${id} · ${stage}` : id,
        run: id,
        stage,
        color,
        dash: perStage ? "" : DASHES[j % DASHES.length], // (a run's page: one stage per chart, all solid)
        points: records.filter((r) => typeof r[key] === "number" && r[x] !== undefined).map((r) => [r[x], r[key]]),
      }))).filter((s) => s.points.length);
      const stages = [...new Set(series.map((s) => s.stage))];
      if (perStage && stages.length > 1) {
        for (const stage of stages) box.append(chart(`${title}: ${key} · stage ${stage}`, series.filter((s) => s.stage === stage), key, { stage, xLabel }));
      } else if (series.length) box.append(chart(`${title}: ${key}`, series, key, { xLabel }));
    }
  }
  if (!box.children.length) box.append(el("div", { class: "muted" }, "no step records yet"));
}

function stageStrip(records) {
  // where each stage of a run lies on its global step axis, e.g. "sft: steps 1–20 · grpo: steps 21–26"
  const parts = byStage(records).map(([stage, recs]) => {
    const steps = recs.map((r) => r.global_step).filter((g) => g !== undefined);
    return steps.length ? `${stage}: steps ${Math.min(...steps)}–${Math.max(...steps)}` : stage;
  });
  return parts.length > 1 ? el("div", { class: "muted", id: "stage-strip" }, `stages (global steps): ${parts.join(" · ")}`) : null;
}

export async function runPage(page) {
  const id = query().get("id");
  const head = el("div", { class: "panel" });
  const charts = el("div", { class: "charts", id: "charts" });
  const config = el("pre", { class: "yaml", id: "resolved" });
  const log = el("pre", { class: "yaml", id: "log" });
  page.append(head, charts,
    el("div", { class: "cols" },
      el("div", { class: "panel" }, el("div", { class: "muted" }, "log (Studio's launch output, or the run's run.log) and failures.jsonl"), log),
      el("div", { class: "panel" }, el("div", { class: "muted" }, "resolved config"), config)));
  async function refresh() {
    const run = await api(`/api/run?id=${encodeURIComponent(id)}`);
    const last = run.last || {};
    head.replaceChildren(...[el("div", { class: "row" }, el("strong", {}, run.id), stateCell(run),
      last.stage ? `${last.stage} step ${last.step} (global ${last.global_step})` : "",
      el("a", { href: `#/trajectories?id=${encodeURIComponent(id)}`, id: "open-trajectories" }, "trajectories"),
      el("a", { href: `#/annotate?id=${encodeURIComponent(id)}`, id: "open-annotate" }, "annotate"),
      run.state === "running" ? el("button", { id: "stop", onclick: () => stop(id, refresh) }, "stop") : null),
      run.error ? el("div", { class: "state failed" }, run.error) : null,
      run.checkpoints.length ? el("div", { class: "muted" }, `checkpoints: ${run.checkpoints.join(", ")}`) : null].filter(Boolean));
    const records = await api(`/api/run/metrics?id=${encodeURIComponent(id)}`);
    const strip = stageStrip(records);
    if (strip) head.append(strip);
    chartsFor([{ id, records }], charts, { perStage: true });
    const tail = await api(`/api/run/log?id=${encodeURIComponent(id)}`);
    log.textContent = `${tail.log.split("\n").slice(-60).join("\n")}${tail.failures.length ? `\n--- failures.jsonl (last ${tail.failures.length})\n${tail.failures.map((f) => JSON.stringify(f)).join("\n")}` : ""}`;
    config.textContent = await api(`/api/run/config?id=${encodeURIComponent(id)}`).catch(() => "(not written yet)");
    return run.state;
  }
  await refresh();
  const timer = setInterval(() => refresh().catch((e) => flash(e.message)), 2000);
  return () => clearInterval(timer);
}

export async function comparePage(page) {
  const all = await api("/api/runs");
  const chosen = new Set((query().get("ids") || "").split(",").filter(Boolean));
  const picks = el("div", { class: "panel row" }, el("strong", {}, "Runs"), all.map((run) => el("label", {},
    el("input", { type: "checkbox", "data-compare": run.id, checked: chosen.has(run.id), onchange: (e) => {
      if (e.target.checked) chosen.add(run.id); else chosen.delete(run.id);
      draw();
    } }), ` ${run.id} `)));
  // x: the global step, or the step within each stage, so that a stage of a multi-stage run and a one-stage
  // run of the same algorithm start at the same x
  const axis = el("select", { id: "compare-x", onchange: () => draw() },
    el("option", { value: "global_step" }, "x: global step"), el("option", { value: "step" }, "x: step within stage"));
  const legend = el("div", { class: "legend panel" });
  const charts = el("div", { class: "charts", id: "charts" });
  page.append(picks, el("div", { class: "panel row" }, axis, el("span", { class: "muted" }, STYLE_NOTE)), legend, charts);
  async function draw() {
    const ids = all.map((r) => r.id).filter((id) => chosen.has(id));
    const runs = await Promise.all(ids.map(async (id) => ({ id, records: await api(`/api/run/metrics?id=${encodeURIComponent(id)}`) })));
    legend.replaceChildren(...ids.map((id, i) => el("span", {}, el("i", { style: `background:${COLORS[i % COLORS.length]}` }), id)));
    chartsFor(runs, charts, { x: axis.value });
  }
  await draw();
  const timer = setInterval(() => draw().catch((e) => flash(e.message)), 4000);
  return () => clearInterval(timer);
}
