// mltrace tab: small DOM helpers and the one way the tab asks the backend for data.
// Every name that comes from a trial goes into the page as text or an attribute value, never as
// HTML. Requests carry an AbortSignal: a panel that is left or reloaded cancels what it asked for.

export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "on") {
      for (const [ev, fn] of Object.entries(v)) node.addEventListener(ev, fn);
    } else if (v !== undefined && v !== null && v !== false) {
      node.setAttribute(k, v === true ? "" : String(v));
    }
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    node.appendChild(typeof c === "string" || typeof c === "number" ? document.createTextNode(String(c)) : c);
  }
  return node;
}

const SVG = "http://www.w3.org/2000/svg";

export function svgEl(tag, attrs = {}) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  return node;
}

export function clear(node) {
  while (node.firstChild) node.removeChild(node.firstChild);
  return node;
}

export function note(node, text, isError = false) {
  clear(node).appendChild(el("div", {class: isError ? "mt-error" : "mt-note"}, text));
}

/** GET ./route?params as JSON; rejects with the backend's error text, or an AbortError. */
export async function getJSON(route, params = {}, signal = undefined) {
  const query = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    if (Array.isArray(v)) v.forEach((x) => query.append(k, x));
    else if (v !== undefined && v !== null && v !== "") query.append(k, v);
  }
  const response = await fetch(`./${route}?${query.toString()}`, {signal, cache: "no-store"});
  const body = await response.json().catch(() => ({error: `HTTP ${response.status}`}));
  if (!response.ok) throw new Error(body.error || `HTTP ${response.status}`);
  return body;
}

/**
 * One section per selected run, each headed by the run's name and filled by
 * `fill(section, answer)` with the answer of the backend route `route` for that run. A run whose
 * request fails shows the error in its own section and the next run goes on; a panel that was
 * left (`ctx.alive()` false) stops there.
 */
export async function runSections(ctx, route, fill) {
  for (const run of ctx.state.selected) {
    const section = el("section", {class: "mt-run-section"}, el("h3", {}, run));
    ctx.root.appendChild(section);
    let answer;
    try {
      answer = await getJSON(route, {run}, ctx.signal);
    } catch (err) {
      if (isAbort(err)) throw err;
      section.appendChild(el("div", {class: "mt-error"}, err.message));
      continue;
    }
    if (!ctx.alive()) return;
    fill(section, answer);
  }
}

export function isAbort(err) {
  return err && err.name === "AbortError";
}
