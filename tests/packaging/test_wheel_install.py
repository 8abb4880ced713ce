"""The installable package: ``python -m build`` makes an sdist and a wheel from the tree as
committed, and the wheel works in a fresh virtual environment that has nothing but it and its
requirements.

One module-scoped fresh venv (``python -m venv``, no system site-packages) takes, in order:

1. ``mltrace[pytorch]`` from the wheel: README's PyTorch quickstart (quickstart_pytorch.py beside
   this file, verbatim) writes a trial there, ``mltrace info`` reads it, and the plugin packages
   import without their extras and fail cleanly where they need them;
2. ``mltrace[tensorboard]``: TensorBoard finds the mltrace tab through ``tensorboard_plugins``;
3. ``mltrace[mlflow]``: MLflow's run-context provider and mltrace's MLflow sink, rule listener and
   ``compare`` command load through their entry points.

Where the packages come from: versions are pinned to what .venv has (a constraints file: numpy,
google-crc32c and torch in step 1, tensorboard too in step 2, everything .venv holds in step 3),
so torch is .venv's CPU build, which lies on this machine's disk (pip's find-links); any other
torch would be a CUDA build of several GB. Steps 1 and 2 use only the file:// package indexes of
pip's configuration when it has them (this machine's hold everything they need, though not every
exact version .venv has), so they never touch the network. MLflow and its requirements are not on
the disk: step 3 downloads them (about 90 packages, mostly wheels of a few MB) through pip's
configured indexes, PyPI included, at the exact versions .venv was built from.
"""

from __future__ import annotations

import configparser
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # ~3 min on 2 cores: torch, then MLflow, into a fresh venv

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = Path(__file__).with_name("quickstart_pytorch.py")
#: repository folder -> the package it installs as
PACKAGES = {"mltrace": "mltrace", "tb_plugin": "mltrace_tb", "mlflow_plugin": "mltrace_mlflow"}
#: entry-point groups the wheel must declare: {group: {name: "module:attr"}}
ENTRY_POINTS = {
    "console_scripts": {"mltrace": "mltrace.cli:main"},
    "tensorboard_plugins": {"mltrace": "mltrace_tb.loader:MltracePluginLoader"},
    "mlflow.run_context_provider": {"mltrace": "mltrace_mlflow.context:MltraceRunContextProvider"},
    "mltrace.sinks": {"mlflow": "mltrace_mlflow.sink:create_sink"},
    "mltrace.diagnosis_listeners": {"mlflow": "mltrace_mlflow.diagnosis:tag_training_run"},
    "mltrace.rule_listeners": {"mlflow": "mltrace_mlflow.rules:create_listener"},
    "mltrace.commands": {"compare": "mltrace_mlflow.command:add_command",
                         "tensorboard": "mltrace_tb.command:add_command",
                         "watch": "mltrace.watch.command:add_command"},
}
#: what mltrace[pytorch] itself requires; pinned to .venv's versions in step 1
CORE = ("numpy", "google-crc32c", "torch")
PIP_TIMEOUT = 420


def _run(argv: list[str | Path], cwd: Path, timeout: float = 300) -> str:
    """Run ``argv`` with an environment that names no other venv; its output, or a failure
    that shows it."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")}
    env.update(PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1", PYTHONDONTWRITEBYTECODE="1")
    proc = subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)
    output = proc.stdout + proc.stderr
    if proc.returncode != 0:
        pytest.fail(f"{' '.join(map(str, argv))} exited {proc.returncode}:\n{output[-6000:]}")
    return output


def _source_version() -> str:
    """``mltrace.__version__`` as the source says it (.venv's installed metadata may be older)."""
    import mltrace

    return mltrace.__version__


def _tracked_tree(dest: Path) -> Path:
    """A copy of the files git would commit (tracked, and untracked but not ignored): what a
    fresh clone in CI has, without build output, caches or venvs."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
        capture_output=True, check=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        src = REPO / rel
        if src.is_file():  # a tracked file deleted in the working tree is skipped
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


def _venv_versions(names: list[str] | None = None) -> str:
    """Constraint lines ``name==version`` of .venv's distributions (all, or ``names``)."""
    lines = {}
    for dist in importlib.metadata.distributions():
        name = dist.metadata["Name"]
        key = re.sub(r"[-_.]+", "-", name).lower()
        if key == "mltrace" or (names is not None and key not in names):
            continue
        lines.setdefault(key, f"{name}=={dist.version}")
    return "\n".join(sorted(lines.values())) + "\n"


def _local_index_args(pip: Path, cwd: Path) -> list[str]:
    """``--index-url`` set to the first file:// index of pip's configuration, so that pip looks
    only on the disk (the configuration's other indexes and find-links still apply); nothing
    (pip's own indexes) where the configuration names no file:// index."""
    config = _run([pip, "config", "list"], cwd)
    urls = [url for line in config.splitlines() if "index-url" in line.split("=", 1)[0]
            for url in line.split("=", 1)[1].strip("'\" ").split()]
    local = [url for url in urls if url.startswith("file://")]
    return ["--index-url", local[0]] if local else []


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The sdist and the wheel that ``python -m build`` makes of the committed tree."""
    root = tmp_path_factory.mktemp("packaging")
    src = _tracked_tree(root / "src")
    # --no-isolation: .venv's setuptools builds it, so the build itself needs no package index
    _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", root / "dist", src], root)
    built = {p.suffix: p for p in (root / "dist").iterdir()}
    assert sorted(built) == [".gz", ".whl"], f"build made {sorted(built)}"
    return {"sdist": built[".gz"], "wheel": built[".whl"], "src": src}


@pytest.fixture(scope="module")
def venv(dists: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the wheel and ``mltrace[pytorch]``'s requirements, from the disk."""
    root = tmp_path_factory.mktemp("venv")
    _run([sys.executable, "-m", "venv", root / "venv"], root)
    pip = root / "venv" / "bin" / "pip"
    (root / "core.txt").write_text(_venv_versions(list(CORE)))
    _run([pip, "install", "--quiet", *_local_index_args(pip, root), "-c", root / "core.txt",
          f"{dists['wheel']}[pytorch]"], root, timeout=PIP_TIMEOUT)
    return root / "venv"


def test_the_wheel_holds_the_three_packages_and_nothing_else(dists):
    wheel = zipfile.ZipFile(dists["wheel"])
    names = set(wheel.namelist())
    meta = {n for n in names if n.split("/")[0].endswith(".dist-info")}
    expected = {f"{package}/{path.relative_to(dists['src'] / folder).as_posix()}"
                for folder, package in PACKAGES.items()
                for path in (dists["src"] / folder).rglob("*") if path.is_file()}
    assert names - meta == expected, (
        f"missing: {sorted(expected - names)}; not in the source: {sorted(names - meta - expected)}")
    for needed in ("mltrace/py.typed", "mltrace/launch/bootstrap/sitecustomize.py",
                   "mltrace_tb/static/index.js", "mltrace_tb/static/style.css"):
        assert needed in names
    entry_points = configparser.ConfigParser(delimiters=("=",))
    entry_points.optionxform = str  # type: ignore[assignment,method-assign]
    entry_points.read_string(wheel.read(next(n for n in meta if n.endswith("entry_points.txt")))
                             .decode())
    assert {g: dict(entry_points[g]) for g in entry_points.sections()} == ENTRY_POINTS
    metadata = wheel.read(next(n for n in meta if n.endswith("/METADATA"))).decode()
    assert f"\nVersion: {_source_version()}\n" in metadata
    assert dists["wheel"].name == f"mltrace-{_source_version()}-py3-none-any.whl"
    assert re.search(r"Requires-Dist: torch[^\n]*extra == \"pytorch\"", metadata)
    assert any(n.endswith("/LICENSE") for n in meta), sorted(meta)  # the Apache-2.0 text ships


def test_the_sdist_holds_the_sources_and_no_tests(dists):
    with tarfile.open(dists["sdist"]) as sdist:
        names = {n.split("/", 1)[1] for n in sdist.getnames() if "/" in n}
    for needed in ("setup.py", "setup.cfg", "pyproject.toml", "README.md", "CHANGELOG.md", "LICENSE",
                   "tb_plugin/static/index.js", "mltrace/launch/bootstrap/sitecustomize.py",
                   "mlflow_plugin/context.py"):
        assert needed in names
    assert not [n for n in names if n.split("/")[0] in ("tests", "bench", "examples", "scripts")]


def test_the_pytorch_quickstart_and_mltrace_info_run_in_a_fresh_venv(venv, tmp_path):
    python = venv / "bin" / "python"
    where = _run([python, "-c", "import mltrace, torch; print(mltrace.__file__, mltrace.__version__,"
                  " torch.__version__)"], tmp_path)
    location, version, torch_version = where.split()
    assert Path(location).is_relative_to(venv), f"mltrace imported from {location}"
    assert version == _source_version()
    assert torch_version == importlib.metadata.version("torch")  # the CPU build, not a download
    out = _run([python, QUICKSTART], tmp_path)  # writes runs/pytorch under tmp_path
    assert "[0, 10, 20, 30, 40]" in out
    assert "'gradient/Sequential_0.weight'" in out
    info = _run([venv / "bin" / "mltrace", "info", tmp_path / "runs" / "pytorch"], tmp_path)
    assert "training ended: True" in info
    assert "GLOBAL: 5 steps (0..40)" in info
    assert "gradients: 4 tensors" in info
    assert "MSELoss_output_0: 5 steps" in info


def test_without_their_extras_the_plugins_import_and_fail_cleanly(venv, tmp_path):
    python = venv / "bin" / "python"
    for module in ("tensorboard", "mlflow"):
        assert "None" in _run([python, "-c", "import importlib.util; "
                               f"print(importlib.util.find_spec({module!r}))"], tmp_path)
    # the packages themselves import nothing heavy; the modules that need the extra say what
    _run([python, "-c", "import mltrace_tb, mltrace_mlflow, mltrace_tb.command, "
          "mltrace_mlflow.command"], tmp_path)
    script = ("import importlib\n"
              "for name in ('mltrace_tb.loader', 'mltrace_mlflow.context'):\n"
              "    try:\n"
              "        importlib.import_module(name)\n"
              "    except ModuleNotFoundError as exc:\n"
              "        print(name, exc.name)\n")
    assert _run([python, "-c", script], tmp_path).split() == [
        "mltrace_tb.loader", "tensorboard", "mltrace_mlflow.context", "mlflow"]
    # every subcommand is listed; the plugins' imports wait until a subcommand runs
    usage = _run([venv / "bin" / "mltrace", "--help"], tmp_path)
    for command in ("info", "compare", "tensorboard", "watch"):
        assert command in usage
    # a hook asked for MLflow without the extra still saves the trial, and says why MLflow is off
    script = ("import mltrace.pytorch as smd, sys\n"
              "smd.Hook(out_dir=sys.argv[1], mlflow=True).close()\n")
    out = _run([python, "-c", script, tmp_path / "run"], tmp_path)
    assert "MLflow logging is off" in out and "No module named 'mlflow'" in out, out


def test_the_tensorboard_extra_gives_tensorboard_the_mltrace_tab(venv, dists, tmp_path):
    pip = venv / "bin" / "pip"
    (tmp_path / "versions.txt").write_text(_venv_versions([*CORE, "tensorboard"]))
    _run([pip, "install", "--quiet", *_local_index_args(pip, tmp_path),
          "-c", tmp_path / "versions.txt", f"{dists['wheel']}[tensorboard]"], tmp_path,
         timeout=PIP_TIMEOUT)
    # TensorBoard's own discovery of plugins (tensorboard.default) finds the tab's loader
    script = ("from tensorboard import default\n"
              "from tensorboard.plugins.base_plugin import TBLoader\n"
              "found = [p for p in default.get_dynamic_plugins() if p.__module__.startswith("
              "'mltrace_tb')]\n"
              "print([p.__module__ + ':' + p.__name__ for p in found], "
              "all(issubclass(p, TBLoader) for p in found))\n")
    out = _run([venv / "bin" / "python", "-c", script], tmp_path)
    assert out.strip() == "['mltrace_tb.loader:MltracePluginLoader'] True"
    _run([venv / "bin" / "python", "-c", "import mltrace_tb.plugin, mltrace_tb.launch"],
               tmp_path)


def test_the_mlflow_extra_loads_every_mlflow_entry_point(venv, dists, tmp_path):
    # MLflow and its requirements are not on this machine's disk: pip's indexes, PyPI included,
    # at the versions .venv has
    pip = venv / "bin" / "pip"
    (tmp_path / "versions.txt").write_text(_venv_versions())
    _run([pip, "install", "--quiet", "-c", tmp_path / "versions.txt",
          f"{dists['wheel']}[mlflow]"], tmp_path, timeout=PIP_TIMEOUT)
    script = (  # mlflow first, as in a user's process: it loads its providers on import
        "import mlflow\n"
        "from importlib.metadata import entry_points\n"
        "from mltrace import plugins\n"
        "for group in ('mltrace.sinks', 'mltrace.rule_listeners', 'mltrace.commands',\n"
        "              'mltrace.diagnosis_listeners', 'mlflow.run_context_provider'):\n"
        "    for ep in entry_points(group=group):\n"
        "        if ep.value.startswith('mltrace'):\n"
        "            obj = ep.load()\n"
        "            print(group, ep.name, obj.__module__ + ':' + obj.__name__)\n"
        "for registry in (plugins.sinks, plugins.rule_listeners, plugins.commands,\n"
        "                 plugins.diagnosis_listeners):\n"
        "    print(registry.group, registry.names(), registry.failures)\n"
        "import os\n"
        "os.environ['MLTRACE_TRIAL'] = '/some/trial'\n"
        "from mlflow.tracking.context.registry import resolve_tags\n"
        "print('tags', resolve_tags().get('mltrace.trial'))\n")
    out = _run([venv / "bin" / "python", "-c", script], tmp_path)
    assert "Failure attempting to register" not in out, out  # MLflow's warning for a provider
    lines = out.splitlines()
    loaded = {tuple(line.split()) for line in lines if len(line.split()) == 3}
    # the TensorBoard tab's loader needs the tensorboard extra: its own test above loads it
    assert loaded >= {(group, name, value) for group, names in ENTRY_POINTS.items()
                      if group not in ("console_scripts", "tensorboard_plugins")
                      for name, value in names.items()}
    assert "mltrace.sinks ['mlflow'] {}" in lines
    assert "mltrace.rule_listeners ['mlflow'] {}" in lines
    assert "mltrace.commands ['compare', 'tensorboard', 'watch'] {}" in lines
    assert "mltrace.diagnosis_listeners ['mlflow'] {}" in lines
    # MLflow itself calls the provider: a run started now would be tagged with the trial
    assert "tags /some/trial" in lines
