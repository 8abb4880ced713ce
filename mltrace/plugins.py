"""One registry per extension point, filled by built-ins and by entry points of other packages.

Groups, what each name maps to, and who looks it up:

- ``mltrace.storage``: URI scheme -> ``factory(location) -> Storage`` (``storage.open_storage``)
- ``mltrace.rules``: rule name -> Rule subclass (``rules.builtin.rule_class``)
- ``mltrace.rule_listeners``: name -> ``factory(options) -> listener | None``
  (``rules.results.rule_listeners``)
- ``mltrace.sinks``: name -> ``factory(hook, options) -> sink`` (``create_sink``, for
  ``Hook(mlflow=...)``)
- ``mltrace.commands``: subcommand name -> ``add_command(subparsers)``, which adds the
  subcommand's argparse parser with ``set_defaults(run=fn)`` (``mltrace.cli.build_parser``)

A registry is a plain dict behind a small class (as MLflow's
``mlflow/tracking/context/registry.py``). The module that owns a built-in registers it explicitly;
the group's entry points are loaded once, on the first lookup that misses or the first listing,
so that a process that needs no plugin never scans installed packages. An entry point never
replaces an explicit registration. A plugin that fails to load is logged once as a warning and
remembered in ``Registry.failures`` (error messages quote it); it never breaks mltrace.

mltrace's core names no plugin package: the MLflow side registers itself (setup.cfg)::

    [options.entry_points]
    mltrace.sinks =
        mlflow = mltrace_mlflow.sink:create_sink
    mltrace.rule_listeners =
        mlflow = mltrace_mlflow.rules:create_listener
    mltrace.commands =
        compare = mltrace_mlflow.command:add_command
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from importlib.metadata import EntryPoint, entry_points
from typing import Any, Generic, TypeVar

from mltrace.exceptions import MltraceTypeError, MltraceValueError

logger = logging.getLogger(__name__)

T = TypeVar("T")

STORAGE_GROUP = "mltrace.storage"
RULES_GROUP = "mltrace.rules"
RULE_LISTENERS_GROUP = "mltrace.rule_listeners"
SINKS_GROUP = "mltrace.sinks"
COMMANDS_GROUP = "mltrace.commands"
DIAGNOSIS_LISTENERS_GROUP = "mltrace.diagnosis_listeners"

#: How to get each group's plugins when none is installed, for error messages.
_INSTALL_HINTS = {
    SINKS_GROUP: "the MLflow sink comes with pip install 'mltrace[mlflow]'",
    RULE_LISTENERS_GROUP: "MLflow rule runs come with pip install 'mltrace[mlflow]'",
    STORAGE_GROUP: "s3:// is built in (pip install 'mltrace[s3]' for boto3)",
    DIAGNOSIS_LISTENERS_GROUP: "MLflow tags of a diagnosis come with pip install 'mltrace[mlflow]'",
    COMMANDS_GROUP: "compare comes with 'mltrace[mlflow]', tensorboard with 'mltrace[tensorboard]'",
}


class Registry(Generic[T]):
    """Named objects of one entry-point group: explicit registrations first, then entry points.

    Args:
        group: the entry-point group, e.g. ``mltrace.sinks``.

    Example:
        >>> from mltrace import plugins
        >>> plugins.sinks.register("print", lambda hook, options: PrintSink())
        >>> plugins.create_sink("print", hook, {})
    """

    def __init__(self, group: str) -> None:
        self.group = group
        self._items: dict[str, T] = {}
        #: entry points that failed to load: {name: "ErrorType: message"}
        self.failures: dict[str, str] = {}
        self._loaded = False
        self._lock = threading.Lock()

    def register(self, name: str, item: T) -> None:
        """Register ``item`` as ``name`` (replacing an earlier registration of that name)."""
        self._items[name] = item
        self.failures.pop(name, None)

    def unregister(self, name: str) -> None:
        """Forget ``name`` (no error if it is not registered)."""
        self._items.pop(name, None)

    def get(self, name: str) -> T | None:
        """The object registered as ``name``, loading the group's entry points on a miss; None
        when neither a registration nor a loadable entry point has that name."""
        item = self._items.get(name)
        if item is None and not self._loaded:
            self.load_entry_points()
            item = self._items.get(name)
        return item

    def items(self) -> dict[str, T]:
        """Every registered object by name, entry points included (a copy)."""
        self.load_entry_points()
        return dict(self._items)

    def names(self) -> list[str]:
        """Sorted names of every registered object, entry points included."""
        return sorted(self.items())

    def load_entry_points(self) -> None:
        """Load the group's entry points (once per process; later calls do nothing). Names
        registered explicitly keep their object; a plugin that fails to load is logged."""
        with self._lock:
            if self._loaded:
                return
            for ep in _entry_points(self.group):
                if ep.name in self._items or ep.name in self.failures:
                    continue  # explicit registrations win; an editable install may list twice
                try:
                    self._items[ep.name] = ep.load()
                except Exception as exc:  # a broken plugin must not break mltrace
                    self.failures[ep.name] = f"{type(exc).__name__}: {exc}"
                    logger.warning("mltrace plugin %s = %s (entry point group %s) could not be "
                                   "loaded and is skipped: %s", ep.name, ep.value, self.group,
                                   self.failures[ep.name])
            self._loaded = True

    def describe_missing(self, name: str) -> str:
        """Why ``name`` is not available and what is: for error messages."""
        known = self.names()
        text = f"installed: {', '.join(known) if known else 'none'}"
        if name in self.failures:
            text = f"its plugin failed to load ({self.failures[name]}); {text}"
        hint = _INSTALL_HINTS.get(self.group)
        return f"{text}; {hint}" if hint else text

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and self.get(name) is not None

    def __repr__(self) -> str:
        return f"<Registry {self.group}: {sorted(self._items)}>"


def _entry_points(group: str) -> list[EntryPoint]:
    """The installed entry points of ``group`` (a broken distribution's metadata is skipped)."""
    try:
        return list(entry_points(group=group))
    except Exception as exc:  # damaged metadata of some installed package
        logger.warning("could not list entry points of group %s: %s", group, exc)
        return []


#: URI scheme -> ``factory(location) -> Storage`` (mltrace.storage registers file:// and s3://).
storage: Registry[Callable[[str], Any]] = Registry(STORAGE_GROUP)
#: rule name -> Rule subclass (mltrace.rules.builtin registers the built-in rules).
rules: Registry[type[Any]] = Registry(RULES_GROUP)
#: listener name -> ``factory(options) -> RuleListener | None`` (see mltrace.rules.results).
rule_listeners: Registry[Callable[..., Any]] = Registry(RULE_LISTENERS_GROUP)
#: sink name -> ``factory(hook, options) -> sink`` (see create_sink).
sinks: Registry[Callable[[Any, dict[str, Any]], Any]] = Registry(SINKS_GROUP)
#: subcommand name -> ``add_command(subparsers)`` (see mltrace.cli.build_parser).
commands: Registry[Callable[[Any], None]] = Registry(COMMANDS_GROUP)
#: listener name -> ``listener(trial_location, report_dict)`` (see mltrace.diagnosis.publish).
diagnosis_listeners: Registry[Callable[[str, dict[str, Any]], None]] = Registry(DIAGNOSIS_LISTENERS_GROUP)

REGISTRIES: dict[str, Registry[Any]] = {
    r.group: r for r in (storage, rules, rule_listeners, sinks, commands, diagnosis_listeners)
}


def registry(group: str) -> Registry[Any]:
    """The registry of entry-point group ``group``.

    Raises:
        MltraceValueError: not one of mltrace's groups (the message lists them).
    """
    try:
        return REGISTRIES[group]
    except KeyError:
        raise MltraceValueError(
            f"no plugin group {group!r}; mltrace's groups are {', '.join(sorted(REGISTRIES))}"
        ) from None


def create_sink(name: str, hook: Any, options: Mapping[str, Any] | bool | None = None) -> Any:
    """The tracking sink ``name`` for ``hook``, made by the factory the ``mltrace.sinks``
    registry holds under that name (``Hook(mlflow=...)`` calls ``create_sink("mlflow", ...)``).

    A sink has ``log_scalar(name, value, mode, mode_step)`` and ``close()``.

    Args:
        name: the sink's name, e.g. ``"mlflow"``.
        hook: the hook whose scalars the sink receives.
        options: the sink's options; True or None mean none (``mlflow=True``).

    Returns:
        whatever the factory returns for ``(hook, options as a dict)``.

    Raises:
        MltraceValueError: no sink ``name`` is installed, or its plugin failed to load (the
            message names the installed sinks and ``pip install 'mltrace[mlflow]'``); the sink's
            own errors for bad options.
        MltraceTypeError: ``options`` is neither a mapping nor True/None.
    """
    if options is None or options is True:
        opts: dict[str, Any] = {}
    elif isinstance(options, Mapping):
        opts = dict(options)
    else:
        raise MltraceTypeError(
            f"{name}={options!r}: pass True or a dict of {name} options, e.g. {name}=True"
        )
    factory = sinks.get(name)
    if factory is None:
        raise MltraceValueError(f"no tracking sink {name!r}: {sinks.describe_missing(name)}")
    return factory(hook, opts)


__all__ = [
    "REGISTRIES", "RULES_GROUP", "RULE_LISTENERS_GROUP", "Registry", "SINKS_GROUP",
    "STORAGE_GROUP", "create_sink", "registry", "rule_listeners", "rules", "sinks", "storage",
]
