// mltrace tab: the Collections panel (each collection, its configuration and tensors).

import {emptyCollectionsText, splitCollections} from "./collections_data.js";
import {el, runSections} from "./dom.js";

function saveConfigText(sc) {
  return Object.entries(sc).map(([mode, c]) => {
    const parts = [`every ${c.save_interval}`];
    if (c.save_steps && c.save_steps.length) parts.push(`steps ${c.save_steps.join(",")}`);
    if (c.start_step) parts.push(`from ${c.start_step}`);
    if (c.end_step !== null && c.end_step !== undefined) parts.push(`until ${c.end_step}`);
    return `${mode}: ${parts.join(", ")}`;
  }).join("\n");
}

export function collectionsPanel(ctx) {
  return runSections(ctx, "collections", (section, answer) => {
    const table = el("table", {class: "mt-table mt-collections"},
      el("tr", {}, ["Collection", "Include regexes", "Save config", "Reductions", "Histogram", "Tensors"].map((h) => el("th", {}, h))));
    const {shown, empty} = splitCollections(answer.collections);
    for (const c of shown) {
      const rc = c.reduction_config;
      const reds = [rc.reductions, rc.mltrace_reductions].filter(Boolean).join(",") || "(none)";
      table.appendChild(el("tr", {},
        el("td", {class: "mt-name"}, c.name),
        el("td", {}, c.include_regex.length ? c.include_regex.map((r) => el("code", {}, r)) : "—"),
        el("td", {class: "mt-pre"}, saveConfigText(c.save_config)),
        el("td", {}, `${reds}${rc.save_raw_tensor ? "; raw tensor" : ""}${rc.save_shape ? "; shape" : ""}`),
        el("td", {}, c.save_histogram ? "yes" : "no"),
        el("td", {}, el("details", {}, el("summary", {}, `${c.tensors.length} tensors`),
          el("ul", {}, c.tensors.map((t) => el("li", {}, t)))))));
    }
    section.appendChild(table);
    if (empty.length) {  // declared, nothing saved in this trial: named, not listed
      section.appendChild(el("details", {class: "mt-empty-collections"},
        el("summary", {}, emptyCollectionsText(empty.length)),
        el("div", {class: "mt-note"}, empty.map((c) => c.name).join(", "))));
    }
  });
}
