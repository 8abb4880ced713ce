"""TensorFlow collections: smdebug's default collections as data, plus ``Collection.add`` for
variables and graph tensors and ``add_keras_layer`` for a layer's inputs/outputs."""

from __future__ import annotations

import re
from typing import Any

import tensorflow as tf

from mltrace.collections import Collection as _CoreCollection
from mltrace.collections import CollectionKeys, CollectionManager
from mltrace.exceptions import MltraceTypeError
from mltrace.tensorflow._tensors import is_keras_variable, variable_name

#: Regexes of the default collections. weights, biases and optimizer_variables are also filled by
#: name from the model (smdebug tracks them by object); see the hooks.
DEFAULT_COLLECTIONS: dict[str, list[str]] = {
    CollectionKeys.ALL: [],
    CollectionKeys.DEFAULT: [],
    CollectionKeys.WEIGHTS: [],
    CollectionKeys.BIASES: ["^(?!gradient).*bias"],
    CollectionKeys.GRADIENTS: ["^gradient"],
    CollectionKeys.LOSSES: [],
    CollectionKeys.METRICS: [],
    CollectionKeys.INPUTS: [r"^inputs(_\d+)?$"],
    CollectionKeys.OUTPUTS: [r"^(labels|predictions)(_\d+)?$"],
    CollectionKeys.LAYERS: [],
    CollectionKeys.SM_METRICS: [],
    CollectionKeys.OPTIMIZER_VARIABLES: [],
}
#: Saved whatever the hook is told (smdebug's TF_DEFAULT_SAVED_COLLECTIONS).
DEFAULT_SAVED_COLLECTIONS = [
    CollectionKeys.METRICS,
    CollectionKeys.LOSSES,
    CollectionKeys.SM_METRICS,
]
TORNASOLE_INCLUDE_COLLECTIONS = [
    CollectionKeys.WEIGHTS,
    CollectionKeys.BIASES,
    CollectionKeys.GRADIENTS,
]
#: What ``layers`` matches when nobody narrowed it: every ``<layer>/inputs|outputs[_<i>]``.
LAYERS_DEFAULT_REGEX = r"^[^/]+/(inputs|outputs)(_\d+)?$"
#: Added when a GradientTape is wrapped (smdebug's tape names: weights/<var>, loss).
TAPE_REGEXES = {
    CollectionKeys.WEIGHTS: r"^weights/.*/((?!bias).)*$",
    CollectionKeys.LOSSES: ".*loss.*",
    CollectionKeys.GRADIENTS: "^gradient",
}


class Collection(_CoreCollection):
    """A collection that can also hold TF variables and graph tensors (``add``) and Keras layers'
    inputs/outputs (``add_keras_layer``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._tf_objects: dict[str, Any] = {}

    def add(self, arg: Any) -> None:
        """Add a tf.Variable / keras.Variable (its value is saved at the end of each due step), a
        graph tf.Tensor or tf.Operation (SessionHook fetches it), or a list/tuple/set of them.

        Raises:
            MltraceTypeError: an eager tensor (it has no name: use ``hook.save_tensor``) or a
                symbolic Keras tensor (use ``add_keras_layer``).
        """
        if isinstance(arg, (list, tuple, set)):
            for item in arg:
                self.add(item)
            return
        if isinstance(arg, tf.Variable) or is_keras_variable(arg):
            name = variable_name(arg)
        elif isinstance(arg, tf.Operation):
            for out in arg.outputs:
                self.add(out)
            return
        elif isinstance(arg, tf.Tensor) and tf.is_symbolic_tensor(arg):
            name = arg.name
        elif isinstance(arg, tf.Tensor) or _is_keras_tensor(arg):
            raise MltraceTypeError(
                f"collection {self.name!r}: {type(arg).__name__} has no stable name to save it by: "
                "save eager values with hook.save_tensor(name, value, collections_to_write=...), "
                "and a Keras layer's outputs with collection.add_keras_layer(layer)"
            )
        else:
            raise MltraceTypeError(
                f"collection {self.name!r}: add() takes tf.Variable, keras.Variable, a graph "
                f"tf.Tensor or tf.Operation, or a list of them; got {type(arg).__name__}"
            )
        self._tf_objects[name] = arg
        self.add_tensor_name(name)

    add_for_mode = add  # smdebug's name; modes do not matter for variables here

    def add_keras_layer(self, layer: Any, inputs: bool = False, outputs: bool = True) -> None:
        """Save ``layer``'s inputs and/or outputs (``<layer>/inputs``, ``<layer>/outputs``, with
        ``_<i>`` when the layer takes or returns several tensors) in this collection."""
        name = getattr(layer, "name", None)
        if not isinstance(name, str):
            raise MltraceTypeError(
                f"add_keras_layer needs a Keras layer, got {type(layer).__name__}"
            )
        for wanted, kind in ((inputs, "inputs"), (outputs, "outputs")):
            if wanted:
                self.include(rf"^{re.escape(name)}/{kind}(_\d+)?$")

    @property
    def tf_objects(self) -> dict[str, Any]:
        """Variables and graph tensors added with ``add``, by the name they are saved under."""
        return self._tf_objects


def _is_keras_tensor(value: Any) -> bool:
    return isinstance(value, tf.keras.KerasTensor)


def collection_manager() -> CollectionManager:
    """A manager holding TensorFlow's default collections."""
    manager = CollectionManager(collection_class=Collection)
    for name, regexes in DEFAULT_COLLECTIONS.items():
        manager.get(name).include(regexes)
    return manager
