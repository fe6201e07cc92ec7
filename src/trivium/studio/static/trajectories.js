// Trajectories: recorded samples token by token (monitor.trajectories), or the newest experiences of the
// run's SQL buffer (decoupled runs: rollout numbers only), each token coloured by the chosen quantity;
// prompt tokens grey, environment tokens (mask false) hatched; every number in a token's tooltip. The
// visual tokens of an image (vision-language samples: record.images, record.image_spans) show as the image.
import { api, el, query } from "./dom.js";

const MEASURES = {
  logprob: { label: "rollout log-prob", values: (r) => r.logprob, diverging: false },
  entropy: { label: "entropy", values: (r) => r.entropy, diverging: false },
  advantage: { label: "advantage", values: (r) => r.advantage, diverging: true },
  gap: { label: "trainer − rollout log-prob", values: (r) => r.trainer_logprob && r.trainer_logprob.map((t, i) => t - r.logprob[i]), diverging: true },
};

function colour(value, scale, diverging) {
  // diverging: blue (negative) - white - red (positive); sequential: white - orange by magnitude
  const x = Math.max(-1, Math.min(1, value / (scale || 1)));
  if (diverging) return x >= 0 ? `rgba(209, 73, 91, ${x * 0.85})` : `rgba(36, 99, 201, ${-x * 0.85})`;
  return `rgba(230, 126, 34, ${Math.abs(x) * 0.85})`;
}

// What the colours mean for the chosen quantity: swatches at -max, 0 and +max of each sample's own scale.
function legend(measure) {
  const m = MEASURES[measure];
  const swatch = (value, text) => el("span", { class: "tok", style: `background:${colour(value, 1, m.diverging)}` }, text);
  const scale = "each sample scaled to its largest |value| on trained tokens";
  return m.diverging
    ? el("span", { id: "colour-legend" }, `${m.label}: `, swatch(-1, "negative"), " ", swatch(0, "0"), " ", swatch(1, "positive"), ` (${scale})`)
    : el("span", { id: "colour-legend" }, `${m.label}: `, swatch(0, "0"), " ", swatch(0.5, "half"), " ", swatch(1, "largest magnitude"), ` (${scale})`);
}

function tokenText(text) {
  return text.replace(/\n/g, "↵").replace(/ /g, "·") || "∅";
}

// The picture standing for the visual tokens [start, end) of image k; env: it came from the environment.
function picture(record, runId, k, start, end, env) {
  const ref = record.images[k];
  const where = env ? "the environment's, not trained" : "prompt";
  return el("img", {
    class: env ? "pic env" : "pic",
    src: `/api/run/image?id=${encodeURIComponent(runId)}&ref=${encodeURIComponent(ref)}`,
    alt: `image ${k + 1}`,
    title: `image ${k + 1} of ${record.images.length}: ${end - start} visual tokens at ${start}-${end - 1} (${where})\nref ${ref}`,
    "data-ref": ref,
    "data-visual-tokens": end - start,
  });
}

// Tokens at positions [from, to) of prompt + response: each made by token(i), each image's run of visual
// tokens replaced by its picture.
function pieces(record, runId, from, to, token) {
  const starts = new Map((record.image_spans || []).map(([s, e], k) => [s, [e, k]]));
  const out = [];
  for (let i = from; i < to; i++) {
    const image = starts.get(i);
    if (image) {
      out.push(picture(record, runId, image[1], i, image[0], i >= record.prompt_ids.length));
      i = image[0] - 1;
    } else out.push(token(i));
  }
  return out;
}

function sample(record, measure, runId) {
  const m = MEASURES[measure];
  const values = m.values(record) || record.logprob.map(() => 0); // buffer records: no trainer numbers
  const at = (v, i) => (v ? v[i] : "—");
  const masked = values.filter((_, i) => record.mask[i]).map(Math.abs);
  const scale = Math.max(1e-6, ...masked);
  const p = record.prompt_ids.length;
  const prompt = pieces(record, runId, 0, p, (i) => el("span", { class: "tok prompt", title: `prompt token ${record.prompt_ids[i]}` }, tokenText(record.prompt_text[i])));
  const response = pieces(record, runId, p, p + record.response_ids.length, (j) => {
    const i = j - p, t = record.response_text[i];
    const env = !record.mask[i];
    const title = env
      ? `environment token ${record.response_ids[i]} (mask false: not trained)`
      : `token ${record.response_ids[i]}\nrollout log-prob ${record.logprob[i]}\ntrainer log-prob ${at(record.trainer_logprob, i)}\nentropy ${at(record.entropy, i)}\nadvantage ${at(record.advantage, i)}`;
    return el("span", {
      class: env ? "tok env" : "tok",
      title,
      "data-advantage": at(record.advantage, i),
      "data-index": i,
      style: env ? "" : `background:${colour(values[i], scale, m.diverging)}`,
    }, tokenText(t));
  });
  const images = record.images ? el("span", {}, `${record.images.length} image(s)`) : null;
  const meanAdv = (record.advantage || []).filter((_, i) => record.mask[i]);
  return el("div", { class: "panel sample", "data-group": record.group_id, "data-global-step": record.global_step, "data-run-index": record.run_index },
    el("div", { class: "row muted" },
      el("strong", {}, `step ${record.stage}/${record.step}`), el("span", {}, `global ${record.global_step}`),
      el("span", {}, `group ${record.group_id}`), el("span", {}, `sample ${record.run_index}`),
      record.turn ? el("span", {}, `turn ${record.turn}`) : null,
      el("span", { class: "reward" }, `reward ${record.reward ?? "pending"}`),
      record.advantage ? el("span", {}, `mean advantage ${(meanAdv.reduce((a, b) => a + b, 0) / Math.max(1, meanAdv.length)).toFixed(3)}`) : null,
      el("span", {}, `weights v${record.model_version}`), el("span", {}, `task ${record.task_id}`), images),
    el("div", { class: "tokens" }, prompt, el("span", { class: "sep" }, "│"), response));
}

export async function trajectoriesPage(page) {
  const id = query().get("id");
  const controls = {
    source: el("select", { id: "traj-source" }, el("option", { value: "recorded" }, "recorded samples"), el("option", { value: "buffer" }, "SQL buffer (newest)")),
    step: el("select", { id: "traj-step" }),
    sort: el("select", { id: "traj-sort" }, ["step", "reward", "length", "advantage"].map((s) => el("option", { value: s }, s))),
    order: el("select", { id: "traj-order" }, el("option", { value: "false" }, "ascending"), el("option", { value: "true" }, "descending")),
    measure: el("select", { id: "traj-measure" }, Object.entries(MEASURES).map(([k, m]) => el("option", { value: k }, m.label))),
  };
  const list = el("div", { id: "samples" });
  const count = el("span", { class: "muted" });
  page.append(
    el("div", { class: "panel row" }, el("a", { href: `#/run?id=${encodeURIComponent(id)}` }, id),
      controls.source, "step", controls.step, "sort by", controls.sort, controls.order, "colour by", controls.measure, count),
    el("div", { class: "muted legend" }, "prompt tokens grey; environment tokens hatched (not trained); an image stands for its visual tokens; hover a token or image for its numbers; ↵ newline, · space"),
    el("div", { class: "muted legend", id: "colour-legend-row" }, legend(controls.measure.value)),
    list);
  let records = [];
  async function load() {
    const params = new URLSearchParams({ id, source: controls.source.value, sort: controls.sort.value, descending: controls.order.value, limit: "100" });
    if (controls.step.value) params.set("step", controls.step.value);
    const answer = await api(`/api/run/trajectories?${params}`);
    if (!controls.step.options.length) {
      controls.step.append(el("option", { value: "" }, "every step"), ...answer.steps.map((s) => el("option", { value: s.global_step }, `${s.stage} ${s.step} (global ${s.global_step})`)));
    }
    records = answer.records;
    count.textContent = `${answer.total} ${controls.source.value === "buffer" ? "buffer experience(s)" : "recorded sample(s)"}${answer.total > records.length ? `, first ${records.length} shown` : ""}`;
    draw();
  }
  function draw() {
    list.replaceChildren(...(records.length ? records.map((r) => sample(r, controls.measure.value, id)) : [el("div", { class: "muted" }, "no recorded samples: the run records every monitor.trajectories.every steps of its RL stages")]));
  }
  for (const c of [controls.step, controls.sort, controls.order]) c.addEventListener("change", load);
  controls.source.addEventListener("change", () => { controls.step.replaceChildren(); controls.step.value = ""; load(); });
  controls.measure.addEventListener("change", () => {
    document.getElementById("colour-legend-row").replaceChildren(legend(controls.measure.value));
    draw();
  });
  await load();
  return null;
}
