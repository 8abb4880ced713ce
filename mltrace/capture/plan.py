"""The save plan: which collections a hook saves, which collections a tensor belongs to, and
which of them are due at the current step.

Decided once per step (``begin``), so the per-tensor question a framework callback asks
(``due_for``) is one memoized lookup.
"""

from __future__ import annotations

import difflib
import logging
import re
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from mltrace.collections import (
    NON_REDUCTION_COLLECTIONS,
    SCALAR_COLLECTIONS,
    TRAIN_ONLY_COLLECTIONS,
    Collection,
    CollectionKeys,
    CollectionManager,
)
from mltrace.config import ReductionConfig, SaveConfig
from mltrace.exceptions import InvalidCollectionConfiguration, MltraceValueError
from mltrace.modes import ModeKeys

if TYPE_CHECKING:
    from mltrace.capture.options import HookOptions

logger = logging.getLogger("mltrace.capture.hook")


#: The most steps the hook counts without asking the plan (see SavePlan.quiet_steps).
QUIET_LIMIT = 100
_NUMBER = re.compile(r"(?<!\d)\d{1,4}(?!\d)")  # see SavePlan.numbers_named


class SavePlan:
    """The collections of a hook and the decision of what is saved when.

    Args:
        manager: the hook's collections (the adapter's defaults already registered).
        include_collections: names of the collections to save.
        save_config: the hook's SaveConfig, used by collections that set none.
        reduction_config: the hook's ReductionConfig, likewise.
        builtin: collections that may be empty when training starts (the adapter fills them).
        is_member: the adapter's membership test of a tensor name in a collection.
    """

    def __init__(self, manager: CollectionManager, include_collections: Iterable[str],
                 save_config: SaveConfig, reduction_config: ReductionConfig, builtin: frozenset[str],
                 is_member: Callable[[Collection, str], bool]) -> None:
        self.manager = manager
        self.include_collections = list(dict.fromkeys(include_collections))
        self.save_config = save_config
        self.reduction_config = reduction_config
        self._builtin = builtin
        self._is_member = is_member
        self.prepared = False
        #: The collections saved, fixed when the first step starts.
        self.saved: list[Collection] = []
        #: The saved collections and those only the flight recorder keeps (see :meth:`watch`).
        self.watched: list[Collection] = []
        self._recorded: list[Collection] = []
        #: Names of tensors watched for NaN (SaveConfigMode.when_nan).
        self.nan_watch: frozenset[str] = frozenset()
        self._members: dict[str, tuple[Collection, ...]] = {}
        #: Counts the changes of memberships (:meth:`forget`): a memo of its own kept by another
        #: part (the flight recorder's) is good while this stays the same.
        self.members_version = 0
        self._due: frozenset[Collection] = frozenset()
        self._warned_missing: set[str] = set()
        #: Collections an adapter creates when they are named: offered for a misspelt name.
        self.suggestions: frozenset[str] = frozenset()
        for coll in manager.get_collections().values():
            self.adopt(coll)

    @classmethod
    def for_hook(cls, options: HookOptions, manager: CollectionManager, default_include: Iterable[str],
                 always: Iterable[str], default_save_config: SaveConfig | None,
                 builtin: frozenset[str], is_member: Callable[[Collection, str], bool]) -> SavePlan:
        """The plan of a hook built with ``options``: the collections named (else the adapter's
        ``default_include``) and those it ``always`` saves, ``include_regex`` added to the
        ``default`` collection and ``save_all`` to ``all``, each then saved too."""
        plan = cls(manager, options.included(default_include, always),
                   options.hook_save_config(default_save_config), options.hook_reduction_config(),
                   builtin, is_member)
        if options.include_regex:
            plan.include_pattern(CollectionKeys.DEFAULT, options.include_regex)
        if options.save_all:
            plan.include_pattern(CollectionKeys.ALL, ".*")
        return plan

    # -- collections ----------------------------------------------------------------------------
    def adopt(self, coll: Collection) -> Collection:
        """Let ``coll`` use the hook's configs where it sets none; returns it."""
        coll.inherit(self.save_config, self.reduction_config)
        return coll

    def include(self, name: str) -> None:
        """Save collection ``name`` too (before the first step)."""
        if name not in self.include_collections:
            self.include_collections.append(name)

    def include_pattern(self, name: str, patterns: str | Iterable[str]) -> None:
        """Add regexes to the collection ``name`` and save it (include_regex, save_all)."""
        self.manager.get(name).include(patterns)
        self.include(name)

    def add_saved(self, coll: Collection) -> bool:
        """Save ``coll`` from now on (after the first step: save_tensor into a new collection);
        True if it was not saved yet."""
        if not self.prepared:
            self.include(coll.name)
            return False
        if coll in self.saved:
            return False
        self.saved.append(coll)
        if coll not in self.watched:
            self.watched.append(coll)
        self.forget()
        return True

    def add_tensor(self, name: str, collections: Iterable[str]) -> bool:
        """Put the tensor ``name`` into the named collections (created if needed) and save them:
        before the first step by name, after it from now on (save_tensor). True if a collection
        is saved from now on that was not before (what is due this step may have changed)."""
        added = False
        for cname in collections:
            coll = self.adopt(self.manager.get(cname, create=True))
            coll.add_tensor_name(name)
            added = self.add_saved(coll) or added
        self.forget(name)
        return added

    def prepare(self) -> None:
        """Fix what is saved, before the first step (collections may be added until then).

        Raises:
            InvalidCollectionConfiguration: a collection named to be saved that has neither
                regexes nor tensor names, or whose reduction config is invalid.
        """
        collections = self.manager.get_collections()
        saving_all = CollectionKeys.ALL in self.include_collections
        self.saved = []
        for name, coll in collections.items():
            self.adopt(coll)
            self._check(name, coll, collections)
            if name in NON_REDUCTION_COLLECTIONS:
                coll.save_histogram = False
                coll.reduction_config = ReductionConfig(save_raw_tensor=True)
            if saving_all or name in self.include_collections:
                self.saved.append(coll)
        self._warn_missing()
        self._rewatch()
        watched = (c.effective_save_config().watched_nan_tensors() for c in self.saved)
        self.nan_watch = frozenset(set().union(*watched) | self.save_config.watched_nan_tensors())
        self.prepared = True
        logger.info("Monitoring the collections: %s", ", ".join(c.name for c in self.saved))

    def watch(self, recorded: Iterable[Collection]) -> None:
        """Also find the tensors of ``recorded`` (the flight recorder's collections), whether or
        not they are saved: :meth:`collections_of` returns them, :meth:`due_for` never does
        unless they are saved and due."""
        self._recorded = list(recorded)
        self._rewatch()

    def _rewatch(self) -> None:
        """``watched``: the saved collections, then the recorded ones not saved; memberships
        are looked up afresh."""
        self.watched = self.saved + [c for c in self._recorded if c not in self.saved]
        self.forget()

    def _check(self, name: str, coll: Collection, collections: dict[str, Collection]) -> None:
        if name not in self._builtin and not coll.include_regex and not coll.tensor_names:
            usable = [n for n, c in collections.items() if n != name and (c.include_regex or c.tensor_names)]
            raise InvalidCollectionConfiguration(
                name, did_you_mean=next(iter(difflib.get_close_matches(name, usable, n=1)), None))
        try:  # lists changed in place (config.reductions.append) were never checked
            coll.effective_reduction_config().validate()
        except MltraceValueError as exc:
            raise InvalidCollectionConfiguration(name, f"collection {name!r}: {exc}") from None

    def _warn_missing(self) -> None:
        """One warning (per name) for include_collections names that no collection has when the
        first step starts. A warning, not an error: smdebug users may still fill such a
        collection later, with ``hook.save_tensor(name, value, collections_to_write=...)``."""
        known = self.manager.collections
        missing = [n for n in self.include_collections if n not in known and n not in self._warned_missing]
        if not missing:
            return
        self._warned_missing.update(missing)
        offered = list(known) + sorted(self.suggestions - set(known))
        hints = "".join(f" Did you mean {close[0]!r} for {n!r}?" for n in missing
                        if (close := difflib.get_close_matches(n, offered, n=1)))
        logger.warning(
            "include_collections names %s, but no collection of that name existed when the first "
            "step started, so nothing is saved for it.%s Known collections: %s. Create a collection "
            "before training with hook.get_collection(name).include(regex); "
            "hook.save_tensor(tensor_name, value, collections_to_write=name) also creates one later.",
            missing, hints, ", ".join(sorted(known)))

    # -- membership -----------------------------------------------------------------------------
    def collections_of(self, name: str) -> tuple[Collection, ...]:
        """The saved (or recorded) collections ``name`` belongs to (memoized; records the name
        in them)."""
        found = self._members.get(name)
        if found is None:
            found = tuple(c for c in self.watched if self._is_member(c, name))
            for c in found:
                c.add_tensor_name(name)
            self._members[name] = found
        return found

    def forget(self, name: str | None = None) -> None:
        """Drop the memoized membership of ``name`` (of every tensor if None)."""
        self.members_version += 1
        if name is None:
            self._members.clear()
        else:
            self._members.pop(name, None)

    def may_save(self, name: str) -> bool:
        """True if some saved collection could match ``name`` (or it is watched for NaN): a
        framework callback that can never save anything need not be installed."""
        return name in self.nan_watch or any(self._is_member(c, name) for c in self.watched)

    def numbers_named(self) -> frozenset[int]:
        """Every number (up to 4 digits) written in a watched collection's regexes or tensor
        names: the indices a collection may ask for by number in names like
        ``<module>_output_<i>``, which a framework's callbacks then look at."""
        found: set[int] = set()
        for c in self.watched:
            for text in (*c.include_regex, *c.tensor_names):
                found.update(int(n) for n in _NUMBER.findall(text))
        return frozenset(found)

    @property
    def memo_size(self) -> int:
        """How many tensor names have memoized memberships (bounded by the model's tensors)."""
        return len(self._members)

    # -- steps ----------------------------------------------------------------------------------
    def begin(self, mode: ModeKeys, mode_step: int) -> bool:
        """Decide which collections are due at ``mode_step`` of ``mode``; True if any is. The
        rules are looked up afresh each step, so a config replaced mid-run takes effect."""
        # Called every step, also on the many that save nothing: kept to a few calls per collection.
        train_only = mode is ModeKeys.EVAL or mode is ModeKeys.PREDICT
        self._due = frozenset(
            c for c in self.saved
            if not (train_only and c.name in TRAIN_ONLY_COLLECTIONS)
            and c.effective_save_config().mode_save_configs[mode].should_save_step(mode_step)
        )
        return bool(self._due)

    def quiet_steps(self, mode: ModeKeys, mode_step: int) -> int:
        """How many steps after ``mode_step`` of ``mode`` no saved collection is due: the hook
        only counts those (mltrace.capture.quiet). At most QUIET_LIMIT, so that a save config
        changed during training takes effect within that many steps."""
        train_only = mode is ModeKeys.EVAL or mode is ModeKeys.PREDICT
        quiet = QUIET_LIMIT
        for c in self.saved:
            if not (train_only and c.name in TRAIN_ONLY_COLLECTIONS):
                due = c.effective_save_config().mode_save_configs[mode].next_save_step(mode_step + 1)
                if due is not None:
                    quiet = min(quiet, due - mode_step - 1)
        return quiet

    def due_for(self, collections: Iterable[Collection]) -> list[Collection]:
        """Those of ``collections`` that are due this step."""
        return [c for c in collections if c in self._due]


def what_to_save(colls: Iterable[Collection]) -> tuple[bool, bool, list[tuple[str, bool]]]:
    """(save raw tensor, save shape, reductions) that a tensor's due collections ask for."""
    save_raw = save_shape = False
    items: list[tuple[str, bool]] = []
    for coll in colls:
        config = coll.effective_reduction_config()
        save_raw |= config.save_raw_tensor
        save_shape |= config.save_shape
        if coll.name not in SCALAR_COLLECTIONS:
            items.extend(i for i in config.items() if i not in items)
    return save_raw, save_shape, items
