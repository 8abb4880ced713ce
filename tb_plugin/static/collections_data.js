// mltrace tab: the Collections panel's data logic, with no DOM, so that node's own test runner
// checks it (tests/tb_plugin/js/collections_data.test.mjs).

/** The collections the panel lists (those with tensors in the trial) and the empty ones, which
 * it folds under one "N empty collections" line: a trial declares many built-in collections
 * that save nothing, and listed in full they bury the few that do. Each keeps its order. */
export function splitCollections(collections) {
  const shown = [], empty = [];
  for (const c of collections || []) ((c.tensors || []).length ? shown : empty).push(c);
  return {shown, empty};
}

/** The folded line's words: "1 empty collection", "3 empty collections". */
export function emptyCollectionsText(n) {
  return `${n} empty collection${n === 1 ? "" : "s"}`;
}
