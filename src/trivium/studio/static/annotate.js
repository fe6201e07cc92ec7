// Annotate: a prompt and the answers a run sampled for it; pick the better one (keys 1-9), edit it first
// (e, then Ctrl+Enter), or skip (s). Each pick becomes preference pairs in a JSONL file DPO trains on.
// With source=calls: the serve mode's calls still waiting for a reward; g / b reward the call good / bad,
// 1-9 rewards that choice good and the others bad, through the serve mode's feedback path.
import { api, el, flash, query } from "./dom.js";

function switcher(id, source) {
  const link = (value, label) => (value === source ? el("strong", {}, label)
    : el("a", { href: `#/annotate?id=${encodeURIComponent(id)}&source=${value}` }, label));
  return el("span", { class: "row" }, link("samples", "recorded samples → DPO pairs"), "·", link("calls", "serve calls → rewards"));
}

async function callsPage(page, id) {
  let calls = [];
  let at = 0;
  let sent = 0;
  const good = el("input", { id: "good-reward", type: "number", step: "any", value: "1", size: 4 });
  const bad = el("input", { id: "bad-reward", type: "number", step: "any", value: "0", size: 4 });
  const box = el("div", { id: "annotate" });
  const status = el("div", { class: "muted", id: "annotate-status" });
  const sample = {
    taskset: el("input", { id: "sample-taskset", placeholder: "task set file in a config folder", size: 32 }),
    field: el("input", { id: "sample-field", value: "question", size: 10 }),
    count: el("input", { id: "sample-count", type: "number", value: "8", min: "1", size: 4 }),
    n: el("input", { id: "sample-n", type: "number", value: "2", min: "1", size: 3 }),
  };
  let offset = 0;
  async function sendTaskset() {
    try {
      const done = await api("/api/annotate/sample", { json: { id, taskset: sample.taskset.value, field: sample.field.value,
        count: Number(sample.count.value), n: Number(sample.n.value), offset } });
      offset = done.next_offset;
      flash(`${done.sent} prompt(s) sent to the endpoint`, true);
      calls = (await api(`/api/annotate/calls?id=${encodeURIComponent(id)}`)).calls;
      at = 0;
      show();
    } catch (error) {
      flash(error.message);
    }
  }
  const header = el("div", { class: "panel row" }, el("a", { href: `#/run?id=${encodeURIComponent(id)}` }, id), switcher(id, "calls"));
  page.append(header);
  try {
    calls = (await api(`/api/annotate/calls?id=${encodeURIComponent(id)}`)).calls;
  } catch (error) {
    // not a serve run (no SQL buffer, or none of its calls): say what this page is for, offer nothing to send
    page.append(el("div", { class: "panel muted", id: "annotate-not-serve" },
      `${id} has no served calls to reward (${error.message}). Served calls come from a run in mode serve `
      + "(trivium run -c CONFIG --set mode=serve); for this run's recorded samples, use recorded samples → DPO pairs above."));
    return null;
  }
  header.append("good", good, "bad", bad,
    el("span", { class: "muted" }, "keys: g good · b bad · 1-9 that choice good, the others bad · s skip"));
  page.append(
    el("div", { class: "panel row" }, "sample a task set through the endpoint:", sample.taskset, "field", sample.field,
      "prompts", sample.count, "answers each", sample.n, el("button", { id: "sample", onclick: sendTaskset }, "send")),
    status, box);

  function show() {
    status.textContent = `${sent} reward(s) sent this session; ${Math.max(0, calls.length - at)} call(s) waiting`;
    if (at >= calls.length) {
      box.replaceChildren(el("div", { class: "panel", id: "annotate-done" }, "no served call is waiting for a reward"));
      return;
    }
    const call = calls[at];
    box.replaceChildren(el("div", { class: "panel", "data-call": call.id },
      el("div", { class: "muted" }, `call ${call.id} · weights v${call.model_version}`),
      el("pre", { class: "yaml prompt-text" }, call.prompt),
      call.answers.map((a, i) => el("div", { class: "answer", "data-answer": i + 1 },
        call.answers.length > 1 ? el("button", { onclick: () => reward(i) }, `${i + 1}`) : null,
        el("span", { class: "muted" }, ` choice ${a.choice}`),
        el("pre", { class: "yaml" }, a.text))),
      el("div", { class: "row" }, el("button", { onclick: () => reward(null, true) }, "good (g)"),
        el("button", { onclick: () => reward(null, false) }, "bad (b)"))));
  }

  async function reward(index, isGood = true) {
    const call = calls[at];
    const value = (yes) => Number(yes ? good.value : bad.value);
    const sends = index === null
      ? [{ choice: null, reward: value(isGood) }]
      : call.answers.map((a, i) => ({ choice: a.choice, reward: value(i === index) }));
    try {
      for (const one of sends) await api("/api/annotate/feedback", { json: { id, call: call.id, ...one } });
      sent += sends.length;
      flash(`call ${call.id}: ${sends.length} reward(s) sent`, true);
    } catch (error) {
      flash(error.message);
      return;
    }
    at += 1;
    show();
  }

  function onKey(e) {
    if (e.target.tagName === "TEXTAREA" || e.target.tagName === "INPUT" || at >= calls.length) return;
    const n = calls[at].answers.length;
    if (e.key === "g") reward(null, true);
    else if (e.key === "b") reward(null, false);
    else if (/^[1-9]$/.test(e.key) && n > 1 && Number(e.key) <= n) reward(Number(e.key) - 1);
    else if (e.key === "s") { at += 1; show(); }
  }

  show();
  document.addEventListener("keydown", onKey);
  return () => document.removeEventListener("keydown", onKey);
}

export async function annotatePage(page) {
  const id = query().get("id");
  if (query().get("source") === "calls") return callsPage(page, id);
  let items = [];
  let at = 0;
  let file = "";
  let written = 0;
  const box = el("div", { id: "annotate" });
  const status = el("div", { class: "muted", id: "annotate-status" });
  page.append(
    el("div", { class: "panel row" }, el("a", { href: `#/run?id=${encodeURIComponent(id)}` }, id), switcher(id, "samples"),
      el("span", { class: "muted" }, "keys: 1-9 pick the better answer · e edit the picked one, Ctrl+Enter saves · s skip")),
    status, box);

  function show() {
    status.textContent = `${written} pick(s) written this session to ${file}; ${Math.max(0, items.length - at)} group(s) left`;
    if (at >= items.length) {
      box.replaceChildren(el("div", { class: "panel", id: "annotate-done" }, "nothing left to annotate in this run's recorded samples"));
      return;
    }
    const item = items[at];
    box.replaceChildren(el("div", { class: "panel", "data-key": item.key },
      el("div", { class: "muted" }, `step ${item.global_step} · group ${item.group_id}${item.system ? ` · system: ${item.system}` : ""}`),
      el("pre", { class: "yaml prompt-text" }, item.prompt),
      item.answers.map((a, i) => el("div", { class: "answer", "data-answer": i + 1 },
        el("button", { onclick: () => pick(i) }, `${i + 1}`), " ",
        el("span", { class: "muted" }, `reward ${a.reward}`),
        el("pre", { class: "yaml" }, a.text)))));
  }

  async function pick(i, edited = null) {
    const item = items[at];
    try {
      const done = await api("/api/annotate", { json: { id, key: item.key, chosen: item.answers[i].run_index, edited } });
      written += 1;
      flash(`${done.pairs} pair(s) written to ${done.file}`, true);
    } catch (error) {
      flash(error.message);
      return;
    }
    at += 1;
    show();
  }

  function edit() {
    const item = items[at];
    const picked = Number(prompt("edit which answer (number)?", "1")) - 1;
    if (!(picked >= 0 && picked < item.answers.length)) return;
    const area = el("textarea", { id: "edit-answer", rows: 4, cols: 80 }, item.answers[picked].text);
    area.addEventListener("keydown", (e) => {
      if (e.key === "Enter" && e.ctrlKey) { e.preventDefault(); pick(picked, area.value); }
      e.stopPropagation();
    });
    box.querySelector(`[data-answer="${picked + 1}"]`).append(area);
    area.focus();
  }

  function onKey(e) {
    if (e.target.tagName === "TEXTAREA" || e.target.tagName === "INPUT" || at >= items.length) return;
    if (/^[1-9]$/.test(e.key) && Number(e.key) <= items[at].answers.length) pick(Number(e.key) - 1);
    else if (e.key === "s") { at += 1; show(); }
    else if (e.key === "e") edit();
  }

  const answer = await api(`/api/annotate?id=${encodeURIComponent(id)}`);
  items = answer.items;
  file = answer.file;
  show();
  document.addEventListener("keydown", onKey);
  return () => document.removeEventListener("keydown", onKey);
}
