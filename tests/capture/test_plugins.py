"""mltrace.plugins: one registry per entry-point group (storage back-ends, rules, rule
listeners, tracking sinks), as MLflow's tests/tracking/context/test_registry.py tests its own."""

from __future__ import annotations

import logging
import subprocess
import sys
from importlib.metadata import EntryPoint
from typing import Any

import pytest

from mltrace import plugins
from mltrace.exceptions import MltraceTypeError, MltraceValueError
from mltrace.plugins import Registry
from mltrace.rules.builtin import BUILTIN_RULES, rule_class
from mltrace.rules.rule import Rule
from mltrace.storage import LocalStorage, open_storage


def _fake_entry_points(monkeypatch: pytest.MonkeyPatch, group: str,
                       specs: dict[str, str]) -> list[str]:
    """Make ``group`` list ``{name: "module:attr"}``; returns the list of groups looked up."""
    looked_up: list[str] = []
    real = plugins._entry_points

    def fake(wanted: str) -> list[EntryPoint]:
        looked_up.append(wanted)
        if wanted != group:
            return real(wanted)
        return [EntryPoint(name, value, group) for name, value in specs.items()]

    monkeypatch.setattr(plugins, "_entry_points", fake)
    return looked_up


def make_print_sink(hook: Any, options: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    return hook, options


# -- the real entry points of this repository's setup.cfg -----------------------------------------
def test_registries_load_the_installed_entry_points() -> None:
    import mltrace_mlflow.rules
    import mltrace_mlflow.sink

    assert Registry(plugins.SINKS_GROUP).get("mlflow") is mltrace_mlflow.sink.create_sink
    listeners = Registry(plugins.RULE_LISTENERS_GROUP)
    assert listeners.get("mlflow") is mltrace_mlflow.rules.create_listener
    assert "mlflow" in plugins.sinks.names() and "mlflow" in plugins.sinks
    assert plugins.registry("mltrace.sinks") is plugins.sinks
    assert set(plugins.REGISTRIES) == {"mltrace.storage", "mltrace.rules",
                                       "mltrace.rule_listeners", "mltrace.sinks",
                                       "mltrace.commands", "mltrace.diagnosis_listeners"}
    with pytest.raises(MltraceValueError, match="mltrace.sinks"):
        plugins.registry("mltrace.sink")


def test_create_sink_reaches_the_mlflow_sink_through_its_entry_point() -> None:
    # The MLflow sink checks its options before it touches the hook or MLflow.
    with pytest.raises(MltraceValueError, match="bogus"):
        plugins.create_sink("mlflow", hook=None, options={"bogus": 1})


def test_import_mltrace_plugins_imports_no_plugin() -> None:
    code = ("import sys, mltrace, mltrace.plugins, mltrace.storage, mltrace.trials; "
            "loaded = [m for m in ('mlflow', 'mltrace_mlflow', 'mltrace_tb', 'tensorboard') "
            "if m in sys.modules]; assert not loaded, loaded")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


# -- the registry ----------------------------------------------------------------------------------
def test_broken_plugin_warns_and_the_others_load(monkeypatch: pytest.MonkeyPatch,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    _fake_entry_points(monkeypatch, "mltrace.tests", {
        "broken": "mltrace_no_such_module:factory",
        "missing_attr": "mltrace.storage.local:NoSuchName",
        "good": "mltrace.storage.local:LocalStorage",
    })
    registry: Registry[Any] = Registry("mltrace.tests")
    with caplog.at_level(logging.WARNING, logger="mltrace.plugins"):
        assert registry.get("good") is LocalStorage
    assert registry.get("broken") is None and registry.get("missing_attr") is None
    assert registry.names() == ["good"]
    assert "ModuleNotFoundError" in registry.failures["broken"]
    assert "AttributeError" in registry.failures["missing_attr"]
    warned = " ".join(r.getMessage() for r in caplog.records)
    assert "broken" in warned and "mltrace_no_such_module" in warned and "missing_attr" in warned


def test_entry_points_are_loaded_once_and_never_replace_a_registration(
        monkeypatch: pytest.MonkeyPatch) -> None:
    looked_up = _fake_entry_points(monkeypatch, "mltrace.tests", {
        "good": "mltrace.storage.local:LocalStorage",
        "mine": "mltrace.storage.local:LocalStorage",
    })
    registry: Registry[Any] = Registry("mltrace.tests")
    registry.register("mine", "explicit")
    assert registry.get("mine") == "explicit"
    assert looked_up == []  # a hit needs no scan of installed packages
    for _ in range(3):
        assert registry.get("nothing") is None
    assert registry.items() == {"mine": "explicit", "good": LocalStorage}
    assert looked_up == ["mltrace.tests"]
    registry.unregister("mine")
    assert registry.get("mine") is None


# -- create_sink ---------------------------------------------------------------------------------
def test_unknown_sink_names_the_installed_ones_and_the_extra() -> None:
    with pytest.raises(MltraceValueError) as info:
        plugins.create_sink("wandb", hook=None, options=True)
    message = str(info.value)
    assert "'wandb'" in message and "mlflow" in message
    assert "pip install 'mltrace[mlflow]'" in message


def test_sink_whose_plugin_fails_to_load(monkeypatch: pytest.MonkeyPatch,
                                         caplog: pytest.LogCaptureFixture) -> None:
    _fake_entry_points(monkeypatch, plugins.SINKS_GROUP,
                       {"mlflow": "mltrace_no_such_module.sink:create_sink"})
    monkeypatch.setattr(plugins, "sinks", Registry(plugins.SINKS_GROUP))
    with caplog.at_level(logging.WARNING, logger="mltrace.plugins"):
        with pytest.raises(MltraceValueError) as info:
            plugins.create_sink("mlflow", hook=None, options={})
    message = str(info.value)
    assert "failed to load" in message and "mltrace_no_such_module" in message
    assert "pip install 'mltrace[mlflow]'" in message
    assert any("mltrace_no_such_module" in r.getMessage() for r in caplog.records)


def test_create_sink_calls_the_factory_with_hook_and_options(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plugins, "sinks", Registry(plugins.SINKS_GROUP))
    plugins.sinks.register("print", make_print_sink)
    hook = object()
    assert plugins.create_sink("print", hook, True) == (hook, {})
    assert plugins.create_sink("print", hook, None) == (hook, {})
    assert plugins.create_sink("print", hook, {"a": 1}) == (hook, {"a": 1})
    with pytest.raises(MltraceTypeError, match="print=5"):
        plugins.create_sink("print", hook, 5)  # type: ignore[arg-type]


# -- the groups' users ---------------------------------------------------------------------------
def test_storage_scheme_from_an_entry_point(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_entry_points(monkeypatch, plugins.STORAGE_GROUP,
                       {"memx": "mltrace.storage.local:LocalStorage", "bad": "nope_mod:x"})
    monkeypatch.setattr(plugins, "storage", Registry(plugins.STORAGE_GROUP))
    storage = open_storage("memx://bucket/run")
    assert isinstance(storage, LocalStorage) and storage.uri == "memx://bucket/run"
    with pytest.raises(MltraceValueError) as info:
        open_storage("bad://x")
    assert "failed to load" in str(info.value) and "memx://" in str(info.value)
    with pytest.raises(MltraceValueError, match="no storage backend for 'gs://x'"):
        open_storage("gs://x")


def test_s3_and_file_stay_built_in() -> None:
    assert plugins.storage.get("s3") is not None
    assert isinstance(open_storage("file:///tmp/x"), LocalStorage)


def test_rule_from_an_entry_point(monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_entry_points(monkeypatch, plugins.RULES_GROUP, {
        "PluginRule": "tests.data.my_custom_rule:CustomGradientRule", "Broken": "nope_mod:Rule"})
    monkeypatch.setattr(plugins, "rules", Registry(plugins.RULES_GROUP))
    for name, cls in BUILTIN_RULES.items():
        plugins.rules.register(name, cls)
    plugin_rule = rule_class("pluginrule")
    assert issubclass(plugin_rule, Rule) and plugin_rule.__name__ == "CustomGradientRule"
    assert rule_class("vanishinggradient") is BUILTIN_RULES["VanishingGradient"]
    assert "PluginRule" not in BUILTIN_RULES  # the built-ins stay the built-ins
    with pytest.raises(MltraceValueError, match="failed to load"):
        rule_class("Broken")
    with pytest.raises(MltraceValueError, match="PluginRule"):
        rule_class("NoSuchRule")


# -- CLI subcommands -------------------------------------------------------------------------------
def add_hello_command(subparsers: Any) -> None:
    hello = subparsers.add_parser("hello", help="a plugin's subcommand")
    hello.add_argument("name")
    hello.set_defaults(run=lambda args: print(f"hello {args.name}") or 0)


def test_cli_subcommands_come_from_the_commands_group(monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str],
                                                      caplog: pytest.LogCaptureFixture) -> None:
    from mltrace import cli

    _fake_entry_points(monkeypatch, plugins.COMMANDS_GROUP, {
        "hello": "tests.capture.test_plugins:add_hello_command", "broken": "nope_mod:add_command"})
    monkeypatch.setattr(plugins, "commands", Registry(plugins.COMMANDS_GROUP))
    with caplog.at_level(logging.WARNING, logger="mltrace.plugins"):
        assert cli.main(["hello", "world"]) == 0
    assert capsys.readouterr().out == "hello world\n"
    assert "nope_mod" in caplog.text  # the broken plugin is named; the built-ins still work
    assert "info" in cli.build_parser().format_help()


def test_installed_cli_lists_the_plugin_subcommands() -> None:
    # The real entry points of setup.cfg: mltrace's own code names neither plugin package.
    out = subprocess.run([sys.executable, "-m", "mltrace.cli", "--help"], check=True,
                         capture_output=True, text=True, timeout=120).stdout
    for command in ("info", "upload-spill", "compare", "tensorboard"):
        assert command in out
    cli_source = (plugins.__file__ or "").replace("plugins.py", "cli.py")
    text = open(cli_source, encoding="utf-8").read()
    assert "mltrace_mlflow" not in text and "mltrace_tb" not in text
