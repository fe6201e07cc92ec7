// The config builder: a form generated from the config schema (every field with its doc, default, type,
// range and choices), stages included; validated live by the server with `trivium check-config`'s checks,
// each problem shown on its field; a YAML preview; save into a config folder, or download.
import { api, el, flash } from "./dom.js";
import { toYaml } from "./yaml.js";

let defs = {};
let cfg = {};
let timer = null;
let lastCheck = null;

const pathText = (parts) => parts.reduce((text, part) => (typeof part === "number" ? `${text}[${part}]` : text ? `${text}.${part}` : part), "");

function deref(s) {
  if (!s) return {};
  if (s.$ref) return { ...deref(defs[s.$ref.split("/").pop()]), description: s.description || deref(defs[s.$ref.split("/").pop()]).description };
  if (s.anyOf) {
    const options = s.anyOf.filter((x) => x.type !== "null");
    if (options.length === 1) return { ...deref(options[0]), nullable: true, description: s.description, default: s.default, title: s.title };
  }
  return s;
}

function getAt(parts) {
  return parts.reduce((node, key) => (node == null ? undefined : node[key]), cfg);
}

function setAt(parts, value) {
  let node = cfg;
  parts.slice(0, -1).forEach((key, i) => {
    if (node[key] == null) node[key] = typeof parts[i + 1] === "number" ? [] : {};
    node = node[key];
  });
  node[parts[parts.length - 1]] = value;
}

function deleteAt(parts) {
  const parent = getAt(parts.slice(0, -1));
  if (parent == null) return;
  delete parent[parts[parts.length - 1]];
  if (parts.length > 1 && typeof parts[parts.length - 2] !== "number" && Object.keys(parent).length === 0) deleteAt(parts.slice(0, -1));
}

function kind(s) {
  if (s.enum) return "enum";
  if (s.type === "boolean") return "bool";
  if (s.type === "integer" || s.type === "number") return "number";
  if (s.type === "string") return "string";
  if (s.type === "array" && s.items && deref(s.items).type === "string" && !deref(s.items).enum) return "strlist";
  return "json";
}

function describe(s) {
  const bits = [kind(s) === "json" ? (s.type || "value") : kind(s) === "strlist" ? "list of text" : s.enum ? "choice" : s.type];
  if (s.default !== undefined) bits.push(`default ${JSON.stringify(s.default)}`);
  const low = s.minimum ?? s.exclusiveMinimum;
  const high = s.maximum ?? s.exclusiveMaximum;
  if (low !== undefined || high !== undefined) bits.push(`range ${s.exclusiveMinimum !== undefined ? "(" : "["}${low ?? "-∞"}, ${high ?? "∞"}${s.exclusiveMaximum !== undefined ? ")" : "]"}`);
  if (s.enum) bits.push(`choices ${s.enum.join(" | ")}`);
  return bits.join(" · ");
}

function input(s, parts) {
  const path = pathText(parts);
  const current = getAt(parts);
  const k = kind(s);
  const changed = (raw) => {
    try {
      if (raw === "" || raw === undefined) deleteAt(parts);
      else if (k === "number") setAt(parts, Number(raw));
      else if (k === "bool") setAt(parts, raw === "true");
      else if (k === "strlist") setAt(parts, raw.split(",").map((x) => x.trim()).filter(Boolean));
      else if (k === "json") setAt(parts, JSON.parse(raw));
      else setAt(parts, raw);
      flash("");
    } catch (error) {
      flash(`${path}: ${error.message} (this field takes JSON, e.g. [{"path": "test.jsonl"}])`);
      return;
    }
    changedConfig();
  };
  if (k === "enum" || k === "bool") {
    const choices = k === "bool" ? ["true", "false"] : s.enum.map(String);
    const select = el("select", { "data-path": path, onchange: (e) => changed(e.target.value) },
      el("option", { value: "" }, `(default: ${JSON.stringify(s.default ?? null)})`),
      choices.map((c) => el("option", { value: c, selected: current !== undefined && String(current) === c }, c)));
    return select;
  }
  if (k === "json") {
    return el("textarea", { "data-path": path, rows: 2, cols: 50, placeholder: "JSON", onchange: (e) => changed(e.target.value.trim()) },
      current === undefined ? "" : JSON.stringify(current));
  }
  const attrs = { "data-path": path, onchange: (e) => changed(e.target.value), placeholder: s.default == null ? "" : String(s.default) };
  if (k === "number") Object.assign(attrs, { type: "number", step: "any", min: s.minimum, max: s.maximum });
  const box = el("input", attrs);
  if (current !== undefined) box.value = k === "strlist" ? current.join(", ") : String(current);
  return box;
}

function section(name, s, parts, open = false) {
  const body = el("div", { class: "body" });
  const props = s.properties || {};
  for (const [key, sub] of Object.entries(props)) {
    if (parts.length === 0 && key === "stages") continue;
    body.append(render(key, sub, [...parts, key]));
  }
  const fs = el("fieldset", { class: open ? "" : "closed", "data-path": pathText(parts) },
    el("legend", { onclick: () => fs.classList.toggle("closed"), title: s.description || "" }, name), body);
  if (s.description) body.prepend(el("div", { class: "muted" }, s.description));
  return fs;
}

function render(key, raw, parts) {
  const s = deref(raw);
  if (s.properties) return section(key, s, parts, getAt(parts) !== undefined);
  return el("div", { class: "field", "data-field": pathText(parts) },
    el("label", { title: pathText(parts) }, key),
    input(s, parts),
    el("div", { class: "meta" }, describe(s)),
    s.description ? el("div", { class: "doc" }, s.description) : null);
}

function stagesPanel(root) {
  const box = el("div", { "data-path": "stages" });
  const stages = Array.isArray(cfg.stages) ? cfg.stages : [];
  const sections = Object.keys(root.properties).filter((k) => !["stages", "project", "name", "checkpoint_root", "mode", "cluster", "runtime"].includes(k));
  stages.forEach((stage, i) => {
    const overrides = el("div");
    for (const key of Object.keys(stage)) {
      if (key !== "name" && key !== "mode" && root.properties[key]) overrides.append(render(key, root.properties[key], ["stages", i, key]));
    }
    const pick = el("select", {}, sections.map((k) => el("option", { value: k }, k)));
    box.append(el("div", { class: "stage", "data-path": `stages[${i}]` },
      el("div", { class: "row" },
        el("strong", {}, `stage ${i + 1}`),
        render("name", { type: "string", description: "the stage's name (its checkpoints and metrics carry it)" }, ["stages", i, "name"]),
        render("mode", root.properties.mode, ["stages", i, "mode"]),
        el("button", { onclick: () => { cfg.stages.splice(i, 1); if (!cfg.stages.length) delete cfg.stages; redraw(); } }, "remove stage")),
      el("div", { class: "row" }, "override a section:", pick,
        el("button", { onclick: () => { stage[pick.value] = stage[pick.value] || {}; redraw(); } }, "add")),
      overrides));
  });
  box.append(el("button", { id: "add-stage", onclick: () => { cfg.stages = [...stages, { name: `stage${stages.length + 1}` }]; redraw(); } }, "add a stage"));
  return el("fieldset", { "data-path": "stages" }, el("legend", {}, "stages"),
    el("div", { class: "muted" }, root.properties.stages.description), box);
}

let rootSchema = null;
let formBox = null;

function redraw() {
  formBox.replaceChildren(section("config", rootSchema, [], true), stagesPanel(rootSchema));
  changedConfig();
}

function changedConfig() {
  document.getElementById("yaml").textContent = toYaml(cfg);
  clearTimeout(timer);
  timer = setTimeout(check, 300);
}

// The folder a config's relative paths are taken from: the config file's own (a config saved as
// quickstart/grpo.yaml under the folder examples reads quickstart/data/... from examples/quickstart),
// as `trivium run -c FILE` does; the config folder itself for a file name without a sub-folder.
function configBase() {
  const name = document.getElementById("save-name").value || "";
  const full = `${document.getElementById("folder").value}/${name}`;
  return full.slice(0, full.lastIndexOf("/"));
}

async function check() {
  const folder = configBase();
  const ticket = {};
  lastCheck = ticket;
  const result = await api("/api/validate", { json: { text: toYaml(cfg), folder } });
  if (lastCheck !== ticket) return; // a newer edit is being checked
  showProblems(result);
}

function showProblems(result) {
  document.querySelectorAll(".problem, .has-problem").forEach((n) => n.classList.remove("problem", "has-problem"));
  document.querySelectorAll(".problem-text").forEach((n) => n.remove());
  const list = document.getElementById("problems");
  list.replaceChildren();
  document.getElementById("verdict").textContent = result.ok ? `valid: stages ${result.stages.join(", ")}` : `${result.problems.length} problem(s)`;
  document.getElementById("verdict").className = result.ok ? "state finished" : "state failed";
  for (const p of result.problems) {
    list.append(el("li", { "data-problem": p.path }, el("code", {}, p.path || "(config)"), ` = ${p.value}: ${p.rule}`, p.fix ? el("div", { class: "muted" }, `fix: ${p.fix}`) : null));
    const field = document.querySelector(`[data-field="${CSS.escape(p.path)}"]`);
    if (field) {
      field.classList.add("problem");
      field.append(el("div", { class: "problem-text" }, `${p.rule}${p.fix ? ` — fix: ${p.fix}` : ""}`));
    }
    let parts = p.path.split(".");
    while (parts.length) {
      parts = parts.slice(0, -1);
      const fs = document.querySelector(`fieldset[data-path="${CSS.escape(parts.join("."))}"]`);
      if (fs) { fs.classList.add("has-problem"); fs.classList.remove("closed"); }
    }
  }
}

export async function builderPage(page) {
  const schema = await api("/api/schema");
  defs = schema.$defs || {};
  rootSchema = schema;
  const info = await api("/api/info");
  const configs = await api("/api/configs");
  formBox = el("div", { id: "form" });
  const folder = el("select", { id: "folder", onchange: () => changedConfig() }, info.configs.map((d) => el("option", { value: d }, d)));
  const pick = el("select", { id: "load-config" }, el("option", { value: "" }, "(a new config)"), configs.map((c) => el("option", { value: c.path }, c.name)));
  const name = el("input", { id: "save-name", placeholder: "my_run.yaml", size: 28, onchange: () => changedConfig() });
  page.append(el("div", { class: "cols" },
    el("div", {},
      el("div", { class: "panel row" }, "start from", pick,
        el("button", { onclick: async () => {
          cfg = pick.value ? await api(`/api/configs/parsed?path=${encodeURIComponent(pick.value)}`) : {};
          if (pick.value) { name.value = configs.find((c) => c.path === pick.value).name; folder.value = configs.find((c) => c.path === pick.value).folder; }
          redraw();
        } }, "load")),
      formBox),
    el("div", {},
      el("div", { class: "panel", id: "check-panel" },
        el("div", { class: "row" }, el("span", { id: "verdict", class: "state" }, "…")),
        el("ul", { id: "problems", class: "problems" }),
        el("div", { class: "row" }, "folder", folder),
        el("div", { class: "row" }, "file", name,
          el("button", { class: "primary", id: "save", onclick: async () => {
            try {
              const saved = await api("/api/configs/save", { json: { path: `${folder.value}/${name.value}`, text: toYaml(cfg) } });
              flash(`saved ${saved.saved}${saved.ok ? "" : ` (with ${saved.problems.length} problem(s))`}`, true);
            } catch (error) { flash(error.message); }
          } }, "save"),
          el("button", { id: "download", onclick: () => {
            const link = el("a", { href: URL.createObjectURL(new Blob([toYaml(cfg) + "\n"], { type: "text/yaml" })), download: name.value || "config.yaml" });
            link.click();
          } }, "download"))),
      el("div", { class: "panel" },
        el("div", { class: "row" }, el("button", { id: "run-doctor", onclick: async () => {
          const out = document.getElementById("doctor");
          out.textContent = "…";
          try {
            out.textContent = (await api("/api/doctor", { json: { text: toYaml(cfg), folder: configBase() } })).text;
          } catch (error) {
            out.textContent = error.body && error.body.problems ? `fix the config first:\n${error.body.problems.map((p) => `${p.path}: ${p.rule}`).join("\n")}` : error.message;
          }
        } }, "doctor"), el("span", { class: "muted" }, "what this config means, per stage: quantities and memory (trivium doctor)")),
        el("pre", { id: "doctor", class: "yaml" })),
      el("div", { class: "panel" }, el("div", { class: "muted" }, "YAML preview"), el("pre", { id: "yaml", class: "yaml" })))));
  cfg = {};
  redraw();
}
