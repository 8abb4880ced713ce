"""The state the parts of the PyTorch adapter share (see TorchAdapterState)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from mltrace.capture.adapter import ReductionItems
from mltrace.exceptions import MltraceValueError
from mltrace.pytorch.compiled import TracedIO
from mltrace.pytorch.optim import OptimizerSteps, ScalerWatch
from mltrace.pytorch.sharded import ReductionBatch
from mltrace.pytorch.stability.probe import StabilityProbe
from mltrace.pytorch.stability.sample_probe import SampleProbe
from mltrace.pytorch.values import TorchValues

if TYPE_CHECKING:
    from mltrace.capture.hook import Hook


#: ``forward``: a step per forward pass of the registered model (smdebug's); ``optimizer``: a
#: TRAIN step per optimizer step, for gradient accumulation; ``trainer``: steps begin where a
#: trainer's callback says a batch begins (:meth:`TorchAdapter.begin_batch`; mltrace.transformers,
#: mltrace.lightning), a TRAIN step per optimizer step as with ``optimizer``.
STEP_BOUNDARIES = ("forward", "optimizer", "trainer")


class TorchAdapterState(TorchValues):
    """What the parts of TorchAdapter share: the registered models and their names, the
    callbacks installed, and the step's bookkeeping. Each part (step boundary, module inputs
    and outputs, gradients and mixed precision, sharded tensors) is a class of its own over this
    state, and TorchAdapter (mltrace.pytorch.adapter) joins them."""

    hook: Hook | None

    def __init__(self, step_boundary: str = "forward") -> None:
        super().__init__()
        if step_boundary not in STEP_BOUNDARIES:
            raise MltraceValueError(
                f"step_boundary={step_boundary!r}: use \"forward\" (a step per forward pass of the "
                "registered model, smdebug's), \"optimizer\" (a step per optimizer step, for "
                "gradient accumulation) or \"trainer\" (steps from a trainer's callback)")
        self.step_boundary = step_boundary
        self.modules: list[torch.nn.Module] = []  # the registered models (unwrapped)
        self.entries: list[torch.nn.Module] = []  # what the script calls (maybe compiled)
        self.traced = TracedIO()
        self.optimizer_steps = OptimizerSteps(self._after_optimizer_step)
        self.scaler: ScalerWatch | None = None
        self._boundary_at = -1  # optimizer steps counted when the current step began
        self._grad_scale: float | None = None  # the loss scale, read once per step
        self.names: dict[int, str] = {}  # id(module) -> its tensor-name prefix
        self._owned: list[torch.nn.Module] = []  # keeps ids in ``names`` from being reused
        self._handles: list[Any] = []
        # Parameters whose gradients may be saved, and their gradient hooks while installed:
        # only during steps that save (see _gradient_hooks)
        self._gradients: list[tuple[str, torch.nn.Parameter]] = []
        self._gradient_handles: list[Any] = []
        self._io_index: dict[str, int] = {}
        #: ``<module>_input_`` / ``_output_`` -> the most tensors seen on that side in one step
        #: (``_io_index`` taken in at each step's beginning): which indices a module's callback
        #: must look at (see _may_save_side)
        self._io_counts: dict[str, int] = {}
        #: numbers written in the saved collections' regexes and names (see _may_save_side)
        self._named_indices: frozenset[int] = frozenset()
        self.stepped = False  # True once a step began (a model's callbacks have run)
        #: False once the saved collections are fixed, if none can hold a parameter
        self._parameters_watched = True
        #: the flight recorder's ``keep`` on a step that only records (``Hook.recording_only``):
        #: the callbacks hand tensors to it directly, else None
        self._keep: Callable[[str, Any], None] | None = None
        # Reductions of sharded tensors (FSDP2), combined across ranks once per step
        self._sharded = ReductionBatch()
        self._sharded_saves: list[tuple[str, tuple[int, ...], ReductionItems]] = []
        #: The transformer-stability signals (mltrace.pytorch.stability), when saved
        self.stability = StabilityProbe(self.names, self.warn_once)
        #: Per-sample losses and input fingerprints (the ``samples`` collection), when wanted
        self.samples = SampleProbe(self.warn_once)
        #: Called with (name, module) for each loss module registered from now on (a sink that
        #: watches every step's loss: mltrace_mlflow's); ``samples.losses`` lists those so far
        self.loss_listeners: list[Callable[[str, torch.nn.Module], None]] = []

    if TYPE_CHECKING:  # implemented by the parts; declared here for the parts that call them
        def save(self, name: str, value: Any) -> None: ...
        def save_io(self, module_name: str, suffix: str, value: Any) -> None: ...
        def _after_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None: ...
        def _save_sharded_reductions(self) -> None: ...
        def _warn_not_stepping(self) -> None: ...
        def _forward_pre_hook(self, module: torch.nn.Module, inputs: Any) -> None: ...
        def _hook_gradient(self, name: str, param: torch.nn.Parameter) -> None: ...
        def _drain_traced(self) -> None: ...
