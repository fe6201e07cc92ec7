// Trivium Studio: the page's router. Pages live in their own modules; what they share is in dom.js.
import { api, flash } from "./dom.js";
import { builderPage } from "./builder.js";
import { runsPage, runPage, comparePage } from "./runs.js";
import { trajectoriesPage } from "./trajectories.js";
import { annotatePage } from "./annotate.js";

let stopPage = null; // a page's timers end when another page opens

async function route() {
  if (stopPage) stopPage();
  stopPage = null;
  flash("");
  const name = (location.hash.replace(/^#\//, "").split("?")[0]) || "runs";
  document.querySelectorAll("nav a").forEach((a) => a.classList.toggle("active", a.dataset.page === name));
  const page = document.getElementById("page");
  page.replaceChildren();
  const pages = { runs: runsPage, run: runPage, builder: builderPage, compare: comparePage, trajectories: trajectoriesPage, annotate: annotatePage };
  try {
    stopPage = await (pages[name] || runsPage)(page);
  } catch (error) {
    flash(error.message);
  }
}

window.addEventListener("hashchange", route);
api("/api/info").then((info) => {
  document.getElementById("where").textContent = `trivium ${info.version} · runs in ${info.root}`;
}).catch((error) => flash(error.message));
route();
