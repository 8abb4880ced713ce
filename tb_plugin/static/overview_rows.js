// mltrace tab: how the overview lays out its rows, with no DOM (node's test runner checks it:
// tests/tb_plugin/js/overview_rows.test.mjs). The backend sends rows in model order, each with
// its kind (a section of its own, on its own colour scale) and its layer (`group`); here the
// rows of several runs become one list of lines: section headers, rows, and a group's one line
// when it is collapsed. Labels drop the prefix every name of a section shares (shown once).

const SEPARATORS = new Set(["/", ".", "_", ":"]);

/** Natural order of names: runs of digits compare as numbers (`_2` before `_10`), case
 * folded, ties by the name itself (as mltrace.analysis.order.natural_key). */
export function naturalCompare(a, b) {
  const pa = String(a).split(/(\d+)/), pb = String(b).split(/(\d+)/);
  for (let k = 0; k < Math.min(pa.length, pb.length); k++) {
    if (k % 2) {
      const d = Number(pa[k]) - Number(pb[k]);
      if (d) return d;
    } else {
      const x = pa[k].toLowerCase(), y = pb[k].toLowerCase();
      if (x !== y) return x < y ? -1 : 1;
    }
  }
  if (pa.length !== pb.length) return pa.length - pb.length;
  return a < b ? -1 : a > b ? 1 : 0;
}

/** The longest prefix every one of `names` shares that ends with a separator (/ . _ :) and
 * leaves a name to each: something that does not start with a digit (`Sequential_2`, not
 * `2`); "" for fewer than two names. */
export function commonPrefix(names) {
  if (names.length < 2) return "";
  let end = names[0].length;
  for (const n of names) {
    let k = 0;
    while (k < end && k < n.length && n[k] === names[0][k]) k++;
    end = k;
  }
  const shortest = Math.min(...names.map((n) => n.length));
  const fits = (k) => SEPARATORS.has(names[0][k - 1]) && k < shortest && names.every((n) => !/[0-9]/.test(n[k]));
  while (end > 0 && !fits(end)) end--;
  return names[0].slice(0, end);
}

/** A group's label: the layer without the section's prefix (its last part when the prefix
 * covers it all). */
export function groupLabel(group, prefix) {
  if (group.length > prefix.length && group.startsWith(prefix)) return group.slice(prefix.length);
  const parts = group.split(/[/.]/);
  return parts[parts.length - 1] || group;
}

/** The rows of several runs' answers as one list [{tensor, kind, group}]: the first answer's
 * order, then what only the others have, each in its kind's section (kinds in first-seen
 * order). */
export function unionRows(answers) {
  const byKind = new Map();
  const seen = new Set();
  for (const a of answers) {
    for (const r of a.rows) {
      if (seen.has(r.tensor)) continue;
      seen.add(r.tensor);
      if (!byKind.has(r.kind)) byKind.set(r.kind, []);
      byKind.get(r.kind).push({tensor: r.tensor, kind: r.kind, group: r.group});
    }
  }
  return [...byKind.values()].flat();
}

/** Consecutive rows of one layer: [{group, rows}] in order. */
function runsOfGroups(rows) {
  const out = [];
  for (const r of rows) {
    const last = out[out.length - 1];
    if (last && last.group === r.group) last.rows.push(r);
    else out.push({group: r.group, rows: [r]});
  }
  return out;
}

/**
 * The overview's lines, top to bottom: a "section" line per kind when there are several, then
 * per layer of two or more rows either its rows (the first carries the group's toggle) or, when
 * `collapsed` has its key, one "group" line; a layer of one row is that row.
 * Returns {lines, sections: [{kind, prefix, count}]}.
 */
export function layoutLines(rows, collapsed = new Set()) {
  const kinds = [...new Set(rows.map((r) => r.kind))];
  const lines = [], sections = [];
  for (const kind of kinds) {
    const own = rows.filter((r) => r.kind === kind);
    const prefix = commonPrefix(own.map((r) => r.tensor));
    sections.push({kind, prefix, count: own.length});
    if (kinds.length > 1) lines.push({type: "section", kind, prefix, count: own.length});
    for (const {group, rows: members} of runsOfGroups(own)) {
      const key = `${kind}\u0000${group}`;
      const label = groupLabel(group, prefix);
      if (members.length > 1 && collapsed.has(key)) {
        lines.push({type: "group", kind, group, key, label, tensors: members.map((r) => r.tensor)});
        continue;
      }
      members.forEach((r, i) => lines.push({
        type: "row", tensor: r.tensor, kind, group, key, label: r.tensor.slice(prefix.length) || r.tensor,
        toggle: members.length > 1 && i === 0 ? label : null, inGroup: members.length > 1,
        groupStart: i === 0, groupSize: members.length,
      }));
    }
  }
  return {lines, sections};
}

/** Every group key of `rows` with two or more rows (what "collapse all" collapses). */
export function groupKeys(rows) {
  const count = new Map();
  for (const r of rows) {
    const key = `${r.kind}\u0000${r.group}`;
    count.set(key, (count.get(key) || 0) + 1);
  }
  return [...count].filter(([, n]) => n > 1).map(([k]) => k);
}

/** One run's line of a collapsed group: per column the largest of its rows' values and the
 * smallest (where it went wrong stays visible, either way), the most steps, non-finite values
 * summed, and which tensors held the largest (`worst`) and the smallest (`least`). */
export function groupRow(rowsByTensor, tensors, cols) {
  const out = {tensor: null, low: Array(cols).fill(null), high: Array(cols).fill(null),
    count: Array(cols).fill(0), nonfinite: [], worst: Array(cols).fill(null), least: Array(cols).fill(null)};
  const bad = new Map();
  for (const t of tensors) {
    const r = rowsByTensor.get(t);
    if (!r) continue;
    for (let c = 0; c < cols; c++) {
      out.count[c] = Math.max(out.count[c], r.count[c] || 0);
      if (r.high[c] !== null && r.high[c] !== undefined && (out.high[c] === null || r.high[c] > out.high[c])) {
        out.high[c] = r.high[c];
        out.worst[c] = t;
      }
      if (r.low[c] !== null && r.low[c] !== undefined && (out.low[c] === null || r.low[c] < out.low[c])) {
        out.low[c] = r.low[c];
        out.least[c] = t;
      }
    }
    for (const [c, nan, pos, neg] of r.nonfinite) {
      const e = bad.get(c) || [c, 0, 0, 0];
      bad.set(c, [c, e[1] + nan, e[2] + pos, e[3] + neg]);
    }
  }
  out.nonfinite = [...bad.values()].sort((a, b) => a[0] - b[0]);
  return out;
}
