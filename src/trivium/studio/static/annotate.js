// Annotate: a prompt and the answers a run sampled for it; pick the better one (keys 1-9), edit it first
// (e, then Ctrl+Enter), or skip (s). Each pick becomes preference pairs in a JSONL file DPO trains on.
import { api, el, flash, query } from "./app.js";

export async function annotatePage(page) {
  const id = query().get("id");
  let items = [];
  let at = 0;
  let file = "";
  let written = 0;
  const box = el("div", { id: "annotate" });
  const status = el("div", { class: "muted", id: "annotate-status" });
  page.append(
    el("div", { class: "panel row" }, el("a", { href: `#/run?id=${encodeURIComponent(id)}` }, id),
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
