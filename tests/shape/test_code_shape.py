"""The library's shape limits (issue 11): the hook stays small enough to hold in the head, no
function grows past a screen, and the capture core names no plugin package.

These read the source with ``ast``; they fail with the place to split, not with a count alone.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.support.source_scan import private_reaches

REPO = Path(__file__).resolve().parents[2]
#: the library's folders (tb_plugin/ and mlflow_plugin/ install as mltrace_tb and mltrace_mlflow)
LIBRARY = ("mltrace", "tb_plugin", "mlflow_plugin")
PLUGIN_PACKAGES = ("mltrace_mlflow", "mltrace_tb")
HOOK_LIMIT = 350
FUNCTION_LIMIT = 80


def _sources() -> list[Path]:
    return sorted(p for pkg in LIBRARY for p in (REPO / pkg).rglob("*.py"))


def _length(node: ast.AST) -> int:
    return int(node.end_lineno or node.lineno) - int(node.lineno) + 1  # type: ignore[attr-defined]


def test_the_core_hook_class_is_at_most_350_lines() -> None:
    tree = ast.parse((REPO / "mltrace" / "capture" / "hook.py").read_text(encoding="utf-8"))
    hook = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Hook")
    assert _length(hook) <= HOOK_LIMIT, (
        f"mltrace/capture/hook.py: class Hook is {_length(hook)} lines (limit {HOOK_LIMIT}): move a job into "
        "its part under mltrace/capture/ instead of growing the hook")


def test_no_function_in_the_library_is_longer_than_80_lines() -> None:
    long = []
    for path in _sources():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _length(node) > FUNCTION_LIMIT:
                long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({_length(node)} lines)")
    assert not long, f"functions over {FUNCTION_LIMIT} lines: split them into named steps: {long}"


def test_mltrace_imports_no_plugin_package() -> None:
    found = []
    for path in sorted((REPO / "mltrace").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            found += [f"{path.relative_to(REPO)}:{node.lineno} {n}" for n in names
                      if n.split(".")[0] in PLUGIN_PACKAGES]
    assert not found, f"mltrace/ must reach plugins through mltrace.plugins' entry points: {found}"


#: Private members of other objects the library reads, each a framework's (or the standard
#: library's) internal with no public alternative, commented where it is read. At most 15.
FRAMEWORK_INTERNALS = {
    "_Loss": "torch.nn's losses' base class",
    "_C": "torch._C, for the autograd engine's graph-task id",
    "_current_graph_task_id": "inside a backward pass (activation checkpointing)",
    "_orig_mod": "the module torch.compile wrapped",
    "_tracking_uri": "Lightning's MLFlowLogger's URI",
    "_active": "Gluon: whether hybridize() is on",
    "_children": "Gluon: a block's children",
    "_push_tape": "TF: where a GradientTape starts recording",
    "_in_graph_mode": "TF: a tf.compat.v1 graph variable",
    "_trainable_variables": "Keras 3: the variables an optimizer was built with",
    "_flatten_layers": "Keras: the recursive walk over nested layers",
    "_control_flow_context": "tf.compat.v1: tensors inside while loops and conds",
    "_processes": "concurrent.futures: a pool's worker processes",
    "_logging_step": "MLflow: samples the system-metrics monitor logged",
    "_metrics_queue": "MLflow: metrics autologging holds unsent",
}
#: Documented standard-library functions whose names start with an underscore.
DOCUMENTED = {"_exit", "_getframe"}


def test_private_members_of_other_objects_are_only_known_framework_internals() -> None:
    assert len(FRAMEWORK_INTERNALS) <= 15
    unknown = [f"{path.relative_to(REPO)}:{line} {name}" for path in _sources()
               for name, line in private_reaches(path)
               if name not in FRAMEWORK_INTERNALS and name not in DOCUMENTED]
    assert not unknown, (
        "the library reads private members of other objects: use or add a public method instead "
        f"(a framework internal with no public alternative goes in FRAMEWORK_INTERNALS): {unknown}")


#: The adapter protocol's size: what a framework must know of the capture core.
ADAPTER_METHOD_LIMIT = 20


def _methods(path: Path, class_name: str) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name)
    return [n.name for n in cls.body if isinstance(n, ast.FunctionDef) and n.name != "__init__"]


def test_the_adapter_protocol_is_small_and_knows_nothing_of_the_flight_recorder() -> None:
    """``Adapter`` (mltrace/capture/adapter.py) has at most 20 methods, none that only the
    flight recorder calls: those are ``RecordingAdapter``'s (mltrace/capture/recording_adapter.py)."""
    core = _methods(REPO / "mltrace" / "capture" / "adapter.py", "Adapter")
    recording = _methods(REPO / "mltrace" / "capture" / "recording_adapter.py", "RecordingAdapter")
    assert len(core) <= ADAPTER_METHOD_LIMIT, f"Adapter has {len(core)} methods: {core}"
    assert not set(core) & set(recording)
    recorder_calls = set()
    for path in (REPO / "mltrace" / "capture").glob("flight_recorder*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) \
                    and node.value.attr == "adapter":
                recorder_calls.add(node.attr)
    only_recorder = recorder_calls - set(core)
    assert only_recorder <= set(recording), f"recorder-only calls outside RecordingAdapter: {only_recorder}"


CLASS_LIMIT = 400
MODULE_LIMIT = 600
TOP_LEVEL_LIMIT = 12
#: Code that is not mltrace's own (none is vendored as Python today; the frontend's charting
#: library is JavaScript).
VENDORED: tuple[str, ...] = ()


def test_no_class_over_400_lines_and_no_module_over_600() -> None:
    big_classes, big_modules = [], []
    for path in _sources():
        if any(part in VENDORED for part in path.parts):
            continue
        text = path.read_text(encoding="utf-8")
        lines = text.count("\n") + 1
        if lines > MODULE_LIMIT:
            big_modules.append(f"{path.relative_to(REPO)} ({lines} lines)")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and _length(node) > CLASS_LIMIT:
                big_classes.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name} ({_length(node)} lines)")
    assert not big_classes, f"classes over {CLASS_LIMIT} lines: split them by concern: {big_classes}"
    assert not big_modules, f"modules over {MODULE_LIMIT} lines: split them by concern: {big_modules}"


def test_the_top_of_mltrace_holds_the_shared_basics_and_front_doors_only() -> None:
    """At most 12 modules directly in mltrace/: everything else lives in the folder of its part."""
    top = sorted(p.name for p in (REPO / "mltrace").glob("*.py"))
    assert len(top) <= TOP_LEVEL_LIMIT, f"{len(top)} modules directly in mltrace/: {top}"
