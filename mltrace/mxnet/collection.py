"""MXNet collections: smdebug's default regexes for Gluon names, and ``add_block_tensors``."""

from __future__ import annotations

import re

from mxnet import gluon

from mltrace.collections import Collection as _CoreCollection
from mltrace.collections import (
    CollectionKeys,
    PendingCollections,
    manager_with_defaults,
    parameter_collection_regexes,
)
from mltrace.exceptions import MltraceTypeError

DEFAULT_COLLECTIONS = parameter_collection_regexes(".*loss._(?!input).*output")
DEFAULT_INCLUDE_COLLECTIONS = [CollectionKeys.LOSSES]


class Collection(_CoreCollection):
    """A collection that can also hold a Gluon block's inputs and outputs."""

    def add_block_tensors(self, block: gluon.Block, inputs: bool = False,
                          outputs: bool = True) -> None:
        """Save ``block``'s inputs and/or outputs with this collection (``<name>_input_<i>``...)."""
        if not isinstance(block, gluon.Block):
            raise MltraceTypeError(
                f"add_block_tensors needs a gluon.Block, got {type(block).__name__}")
        # Anchored, unlike smdebug's "conv0_input_*", which also matched "myconv0_input_0".
        if inputs:
            self.include(f"^{re.escape(block.name)}_input_")
        if outputs:
            self.include(f"^{re.escape(block.name)}_output_")


#: Collections made with smd.get_collection(...) before a hook exists go to the next hook created.
pending = PendingCollections(lambda: manager_with_defaults(DEFAULT_COLLECTIONS, Collection))
