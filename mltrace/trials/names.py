"""Tensor-name and collection queries of ``Trial``: the collections the training wrote (and
those an analysis adds), which tensor names were saved, at which step, matching a pattern or
belonging to a collection, and where each tensor's records live (``index_entries``).
"""

from __future__ import annotations

import difflib
import logging
import re
from typing import Any

from mltrace.collections import Collection
from mltrace.exceptions import MltraceTypeError, MltraceValueError, TensorUnavailable
from mltrace.modes import ModeKeys, mode_from
from mltrace.trials.index import TensorEntries
from mltrace.trials.refresh import TrialRefresh

logger = logging.getLogger("mltrace.trials")  # the name users configure: the package's


def _compile_regex(regex: Any) -> re.Pattern[str]:
    """Compile a ``tensor_names(regex=...)`` pattern, or raise naming it and the fix."""
    try:
        return re.compile(regex)
    except (re.error, TypeError) as exc:
        raise MltraceValueError(
            f"tensor_names(regex={regex!r}): not a valid regular expression ({exc}); to match a "
            "name literally, escape it: regex=re.escape(name)"
        ) from None


class NameQueries(TrialRefresh):
    """The collections and tensor names of a trial, and the index entries of one tensor."""

    # -- collections --------------------------------------------------------------------------
    def collections(self) -> dict[str, Collection]:
        """The collections of the trial (from the first worker's collections file)."""
        return self._collection_manager.get_collections()

    def collection(self, name: str) -> Collection:
        """One collection by name. A name the trial's collections file does not hold gives a new,
        empty collection that lives in this Trial object only (smdebug does the same), so that an
        analysis can group tensors itself and query by it::

            trial.collection("mine").include("^fc1")
            trial.collection("mine").add_tensor_name("loss")
            trial.tensor_names(collection="mine")

        Raises:
            MltraceTypeError: ``name`` is not a string.
        """
        if not isinstance(name, str):
            raise MltraceTypeError(
                f"collection name {name!r} must be a string, e.g. trial.collection('weights')")
        if name not in self._collection_manager.collections:
            logger.debug("trial %s: new analysis-side collection %r", self.name, name)
        return self._collection_manager.get(name, create=True)

    def _collection_arg(self, collection: str | Collection) -> Collection:
        """``tensor_names(collection=...)``: a Collection object, or a name (see collection)."""
        if isinstance(collection, Collection):
            return collection
        if not isinstance(collection, str):
            raise MltraceTypeError(
                f"tensor_names(collection={collection!r}): pass a collection name or a Collection")
        return self.collection(collection)

    def _warn_empty_collection(self, coll: Collection) -> None:
        """A query by collection found nothing. A misspelt name creates an empty collection (as
        in smdebug), so warn when the name is close to one the training wrote, and when an
        analysis-side collection the user filled matches nothing (smdebug warned then too);
        otherwise (common in rules and views) debug only."""
        written = sorted(self._written_collections)
        close = [] if coll.name in self._written_collections else difflib.get_close_matches(
            coll.name, written, n=1)
        if close:
            logger.warning("no tensor of trial %s is in collection %r, which the training did "
                           "not write (did you mean %r?)", self.name, coll.name, close[0])
        elif coll.name not in self._written_collections and (coll.include_regex
                                                             or coll.tensor_names):
            logger.warning("no tensor of trial %s is in collection %r (include_regex %s, "
                           "tensor_names %s)", self.name, coll.name, coll.include_regex,
                           sorted(coll.tensor_names))
        else:
            logger.debug("no tensor of collection %r in trial %s", coll.name, self.name)

    # -- tensor names -------------------------------------------------------------------------
    def tensor_names(
        self, show_prefixed_tensors: bool = False, *, step: int | None = None,
        mode: ModeKeys | str = ModeKeys.GLOBAL, regex: str | list[str] | None = None,
        collection: str | Collection | None = None,
    ) -> list[str]:
        """Sorted tensor names, optionally those saved at ``step`` (of ``mode``), matching
        ``regex`` (re.search, any of a list) or belonging to ``collection`` (not both)."""
        if regex is not None and collection is not None:
            raise MltraceValueError(
                f"tensor_names(regex={regex!r}, collection={collection!r}): pass one of them, "
                "not both (as smdebug)")
        self.maybe_refresh()
        mode = mode_from(mode)
        tensors = self._index.tensors
        names = set(tensors)
        if step is not None:
            g = self._index.to_global(step, mode)
            names = {n for n in names if g is not None and g in tensors[n].global_steps()}
        elif mode is not ModeKeys.GLOBAL:  # names saved in that mode (smdebug)
            steps = set(self._index.mode_to_global.get(mode, {}).values())
            names = {n for n in names if steps & tensors[n].global_steps()}
        if regex is not None:
            patterns = [_compile_regex(r) for r in ([regex] if isinstance(regex, str) else regex)]
            names = {n for n in names if any(p.search(n) for p in patterns)}
        if collection is not None:
            coll = self._collection_arg(collection)
            names = {n for n in names if coll.matches(n)}
            if not names:
                self._warn_empty_collection(coll)
        if not names:
            logger.debug("tensor_names found no tensor for step=%s regex=%s collection=%s",
                         step, regex, collection)
        return sorted(names)

    def has_tensor(self, name: str) -> bool:
        """True if the trial holds tensor ``name``."""
        if name not in self._index.tensors:
            self.maybe_refresh()
        return name in self._index.tensors

    # -- the index as read so far (no refresh): what Tensor, the rules and plugins build on -----
    def index_entries(self, name: str) -> TensorEntries:
        """Where each record of tensor ``name`` lives, per global step and worker.

        Answers from the index files read so far (call ``maybe_refresh`` first to look for new
        ones). The object is the reader's own: read it, do not change it.

        Args:
            name: a tensor name (one of ``tensor_names()``).

        Returns:
            TensorEntries: ``values`` {global step: {worker: Location}}, ``reductions``
            {global step: {worker: {(reduction, abs): Location}}}, ``shapes``
            {global step: {worker: shape}}, and ``global_steps()``.

        Raises:
            TensorUnavailable: the index holds no record of ``name``.
        """
        try:
            return self._index.tensors[name]
        except KeyError:
            raise TensorUnavailable(name) from None

    def tensor_count(self) -> int:
        """How many tensor names the index files read so far hold (no refresh); cheap, so that
        a consumer can cache what it derives from ``tensor_names()`` until this changes."""
        return len(self._index.tensors)
