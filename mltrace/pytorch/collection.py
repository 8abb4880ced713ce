"""PyTorch collections (``mltrace.pytorch.collection``, smdebug's module path: ``from
smdebug.pytorch.collection import Collection``): smdebug's default regexes for PyTorch names, and
``add_module_tensors``."""

from __future__ import annotations

from typing import Any

import torch

from mltrace.collections import Collection as _CoreCollection
from mltrace.collections import (
    CollectionKeys,
    CollectionManager,
    PendingCollections,
    manager_with_defaults,
    parameter_collection_regexes,
)
from mltrace.exceptions import MltraceTypeError

DEFAULT_COLLECTIONS = parameter_collection_regexes("[Ll]oss_(?!input).*output")
DEFAULT_INCLUDE_COLLECTIONS = [CollectionKeys.LOSSES]


class Collection(_CoreCollection):
    """A collection that can also hold a module's inputs and outputs."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._modules: dict[torch.nn.Module, tuple[bool, bool]] = {}

    def add_module_tensors(self, module: torch.nn.Module, inputs: bool = False, outputs: bool = True) -> None:
        """Save ``module``'s inputs and/or outputs with this collection (names are resolved when
        the hook registers the model, so this may be called before the hook exists)."""
        if not isinstance(module, torch.nn.Module):
            raise MltraceTypeError(f"add_module_tensors needs a torch.nn.Module, got {type(module).__name__}")
        self._modules[module] = (inputs, outputs)

    @property
    def modules(self) -> dict[torch.nn.Module, tuple[bool, bool]]:
        """Modules added with add_module_tensors, with their (inputs, outputs) flags."""
        return self._modules


#: Collections made with smd.get_collection(...) before a hook exists (Tornasole's PyTorch README does this) land
#: here and are handed to the next hook created.
pending = PendingCollections(lambda: manager_with_defaults(DEFAULT_COLLECTIONS, Collection))


__all__ = ["Collection", "CollectionKeys", "CollectionManager", "DEFAULT_COLLECTIONS",
           "DEFAULT_INCLUDE_COLLECTIONS"]
