"""The four front doors spell smdebug's hook arguments out (``help()`` and IDEs show them) and
hand them to ``HookOptions.from_front_door``, the one definition: each signature holds every
HookOptions field a user sets, in the same order, with the same default and type."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import inspect

import pytest

from mltrace.capture.options import HookOptions

#: (module, class) of each front door; a door's own arguments may sit between the shared ones
#: (XGBoost's data, as smdebug has them) or after them (PyTorch's step_boundary).
FRONT_DOORS = [("mltrace.pytorch", "Hook"), ("mltrace.tensorflow", "KerasHook"),
               ("mltrace.tensorflow", "SessionHook"), ("mltrace.xgboost", "Hook"),
               ("mltrace.mxnet", "Hook")]
SHARED = [f for f in dataclasses.fields(HookOptions) if f.name != "sinks"]  # sinks: not smdebug's


@pytest.mark.parametrize("module, name", FRONT_DOORS, ids=[f"{m}.{n}" for m, n in FRONT_DOORS])
def test_a_front_door_spells_out_the_shared_hook_arguments(module, name):
    if module == "mltrace.mxnet" and importlib.util.find_spec("mxnet") is None:
        pytest.skip("MXNet lives in .venv-legacy")
    door = getattr(importlib.import_module(module), name)
    params = inspect.signature(door.__init__).parameters
    missing = [f.name for f in SHARED if f.name not in params]
    assert not missing, f"{module}.{name} lacks {missing}"
    order = [p for p in params if p in {f.name for f in SHARED}]
    assert order == [f.name for f in SHARED], f"{module}.{name}: smdebug's order is {[f.name for f in SHARED]}"
    for f in SHARED:
        param = params[f.name]
        default = None if f.name == "out_dir" else f.default  # a front door's out_dir may be omitted
        assert param.default == default, f"{module}.{name}({f.name}=...): default {param.default!r}"
        annotation = "str | None" if f.name == "out_dir" else f.type
        assert param.annotation == annotation, f"{module}.{name}({f.name}): {param.annotation}"


def test_the_options_come_from_the_front_doors_call_by_name(tmp_path):
    """What a front door was called with reaches HookOptions, saveall included."""
    import mltrace.pytorch as smd

    hook = smd.Hook(str(tmp_path / "run"), False, None, True, include_collections=["weights"],
                    saveall=True, stop_check_interval=7.0, step_boundary="optimizer")
    try:
        options = hook.options
        assert options.out_dir == str(tmp_path / "run") and options.dry_run is True
        assert options.save_all is True and options.stop_check_interval == 7.0
        assert list(options.include_collections or []) == ["weights"]
        assert hook.torch.step_boundary == "optimizer"
    finally:
        hook.close()
