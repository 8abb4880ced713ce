// mltrace for TensorBoard: the entry module of the "mltrace" tab.
//
// Plain ES modules, no build step, no CDN: TensorBoard loads this file into the plugin's iframe,
// whose <base href> makes "./runs" mean /data/plugin/mltrace/runs. The panels live in their own
// modules (overview.js, detail.js, rules.js, collections.js) over the pure data logic of data.js
// (tested with node --test); the chart library is uPlot 1.6.32, vendored in static/ (MIT).
//
// Each panel draws into a container of its own with an AbortSignal: switching panels, or a reload,
// aborts what the previous one asked for and detaches its container, so a late answer can never
// put its sections into another panel. The tab follows live trials: it polls /run while a
// selected trial has not ended (a visible "live" badge) and redraws the panel when tensors or
// steps appear; TensorBoard's reload button (its DataReloaded message) refreshes at once.

import {clear, el, getJSON, isAbort, note} from "./static/dom.js";
import {runChanged} from "./static/data.js";
import {overviewPanel} from "./static/overview.js";
import {detailPanel} from "./static/detail.js";
import {rulesPanel} from "./static/rules.js";
import {collectionsPanel} from "./static/collections.js";

const PANELS = {overview: ["Overview", overviewPanel], tensor: ["Tensor", detailPanel],
  rules: ["Rules", rulesPanel], collections: ["Collections", collectionsPanel]};
const POLL_MS = 5000;

const state = {
  panel: "overview", runs: [], selected: new Set(), overviewRun: "", collection: null, statistic: "l2",
  overviewMode: "", overviewWorker: "", filter: "", tensor: "", statistics: null, perWorker: false, logY: false, maxPoints: "",
  step: null,  // a global step the detail view marks and opens its values at (the diagnosis' links)
};
const info = new Map();  // run -> its latest /run answer (refreshed by every poll; never kept as is)
const ui = {};
let current = null;      // {gen, controller}
let generation = 0;
let pollTimer = null;

export async function render() {
  document.head.append(el("link", {rel: "stylesheet", href: "./static/uPlot.min.css"}),
    el("link", {rel: "stylesheet", href: "./static/style.css"}));
  ui.runList = el("div", {class: "mt-runs"});
  ui.live = el("span", {class: "mt-live", id: "mt-live"});
  ui.main = el("main", {class: "mt-main"});
  const nav = el("nav", {class: "mt-nav"}, Object.entries(PANELS).map(([p, [label]]) =>
    el("button", {class: "mt-tab", "data-panel": p, on: {click: () => showPanel(p)}}, label)), ui.live);
  document.body.append(el("div", {class: "mt-app"},
    el("aside", {class: "mt-side"}, el("h2", {}, "Runs"), ui.runList),
    el("div", {class: "mt-body"}, nav, ui.main)));
  listenForReload();
  await loadRuns();
  showPanel(state.panel);
  schedulePoll();
}

/** The trials found and the selected ones' /run, afresh; true when anything changed. */
async function loadRuns() {
  const before = state.runs.join("\n");
  try {
    const answer = await getJSON("runs");
    state.runs = answer.runs.map((r) => r.name);
  } catch (err) {
    note(ui.main, `Could not list trials: ${err.message}`, true);
    return false;
  }
  for (const r of [...state.selected]) if (!state.runs.includes(r)) state.selected.delete(r);
  if (!state.selected.size && state.runs.length) state.selected.add(state.runs[0]);
  const listChanged = before !== state.runs.join("\n");
  if (listChanged) drawRunList();
  const infoChanged = await refreshInfo();
  return listChanged || infoChanged;
}

/** /run of every selected trial, afresh; true when one of them changed since the last look. */
async function refreshInfo() {
  let changed = false;
  await Promise.all([...state.selected].map(async (run) => {
    try {
      const answer = await getJSON("run", {run});
      if (runChanged(info.get(run), answer)) changed = true;
      info.set(run, answer);
    } catch (err) {
      info.delete(run);
    }
  }));
  drawLive();
  return changed;
}

function drawLive() {
  const known = [...state.selected].map((r) => info.get(r)).filter(Boolean);
  const live = known.filter((i) => !i.ended);
  const time = new Date().toLocaleTimeString();
  ui.live.className = `mt-live ${live.length ? "mt-live-on" : "mt-live-off"}`;
  ui.live.textContent = live.length
    ? `● live: following ${live.map((i) => i.run).join(", ")} (updated ${time})`
    : (known.length ? "ended: training finished" : "");
}

function schedulePoll() {
  clearTimeout(pollTimer);
  pollTimer = setTimeout(async () => {
    const following = [...state.selected].some((r) => !(info.get(r) || {}).ended);
    if (following && await refreshInfo()) refreshPanel();
    schedulePoll();
  }, POLL_MS);
}

/** TensorBoard's reload button (and its auto-reload) reaches plugins as an "experimental.
 * DataReloaded" message on the port this frame offers to its host. */
function listenForReload() {
  if (window.parent === window || typeof MessageChannel === "undefined") return;
  const channel = new MessageChannel();
  channel.port1.onmessage = async (event) => {
    let msg;
    try { msg = JSON.parse(event.data); } catch { return; }
    if (msg.isReply) return;
    channel.port1.postMessage(JSON.stringify({type: msg.type, id: msg.id, payload: null, error: null, isReply: true}));
    if (msg.type === "experimental.DataReloaded") await reloadAll();
  };
  channel.port1.start();
  window.parent.postMessage("experimental.bootstrap", window.location.origin, [channel.port2]);
}

/** Everything afresh: the trials found, their modes and tensors; the panel is redrawn when
 * something changed (TensorBoard also sends this on its periodic reload). */
export async function reloadAll() {
  if (await loadRuns()) refreshPanel();
}

function drawRunList() {
  clear(ui.runList);
  if (!state.runs.length) {
    ui.runList.append(el("p", {class: "mt-note"},
      "No mltrace trials found. Start TensorBoard with --mltrace_logdir=DIR, or use `mltrace tensorboard DIR`."));
    return;
  }
  for (const run of state.runs) {
    const box = el("input", {type: "checkbox", class: "mt-run", value: run, checked: state.selected.has(run),
      on: {change: async (e) => {
        if (e.target.checked) state.selected.add(run); else state.selected.delete(run);
        await refreshInfo();
        showPanel(state.panel);
      }}});
    ui.runList.append(el("label", {class: "mt-runlabel", title: run}, box, " ", run));
  }
}

function refreshPanel() {
  showPanel(state.panel);
}

function showPanel(panel) {
  state.panel = panel;
  for (const b of document.querySelectorAll(".mt-tab")) b.classList.toggle("mt-active", b.getAttribute("data-panel") === panel);
  if (current) current.controller.abort();
  const gen = ++generation;
  const controller = new AbortController();
  current = {gen, controller};
  clear(ui.main);
  const root = el("div", {class: "mt-panel", "data-panel": panel});
  ui.main.append(root);
  if (!state.selected.size) {
    note(root, "Select a run on the left.");
    return;
  }
  const ctx = {
    root, state, info, signal: controller.signal,
    alive: () => gen === generation && !controller.signal.aborted,
    reload: () => showPanel(panel),
    redraw: () => showPanel(panel),
    openDetail: (tensor, step = null) => { state.tensor = tensor; state.step = step; showPanel("tensor"); },
  };
  PANELS[panel][1](ctx).catch((err) => {
    if (isAbort(err) || !ctx.alive()) return;
    root.append(el("div", {class: "mt-error"}, err.message));
  });
}
