"""mltrace's callbacks on a user's modules, which never travel with the module.

Pickling a module (``torch.save(model)``, ``pickle.dumps``, ``copy.deepcopy``, a
``torch.multiprocessing`` spawn, Ray) pickles its ``__dict__``, and with it the forward hooks in
it. mltrace's callbacks are closures over the hook, which neither can nor should be pickled
(smdebug documents that its hook is never pickled with the model). So every module mltrace
attaches to gets an instance attribute ``__reduce_ex__`` (pickle, ``copy`` and ``torch.save``
look that name up on the instance) that reduces the module as its class would and then takes
out of the state what mltrace added: its hook entries, the instance attributes it replaced
(given back their values from before), and itself. The copy, or the module loaded from the
file, is the user's model as it was before the hook registered it: no mltrace callback runs in
it, and loading it needs no mltrace. A hook that registers the copy attaches to it afresh.

Callbacks on parameters (gradient hooks) need nothing of this: torch never pickles tensor
hooks; :func:`tensor_hook` marks them so that torch does not warn about it either.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.hooks import RemovableHandle

#: Module attributes holding forward hooks, or flags keyed by the same handle ids.
_HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks", "_forward_hooks_with_kwargs",
               "_forward_hooks_always_called", "_forward_pre_hooks_with_kwargs")
#: The instance attribute pickle looks up before the class's.
_REDUCE = "__reduce_ex__"
#: Replaced instance attributes that had no value of their own before.
_ABSENT = object()


class _ReduceWithoutMltrace:
    """A module's ``__reduce_ex__`` while mltrace is attached to it: the class's reduction,
    less mltrace's hook entries and attributes (see the module docstring)."""

    __slots__ = ("module", "handle_ids", "replaced")

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = weakref.ref(module)
        self.handle_ids: set[int] = set()
        #: instance attributes mltrace replaced: name -> the value before (or _ABSENT)
        self.replaced: dict[str, Any] = {}

    def __call__(self, protocol: int) -> Any:
        module = self.module()
        assert module is not None  # called on the module, which holds this object
        reduced = type(module).__reduce_ex__(module, protocol)
        if not isinstance(reduced, tuple) or len(reduced) < 3:
            return reduced  # no state (what torch.compile returned): nothing of mltrace's goes
        state, slots = reduced[2], None
        if isinstance(state, tuple) and len(state) == 2:
            state, slots = state
        if not isinstance(state, dict):
            return reduced
        clean = self.without_mltrace(state)
        return (*reduced[:2], clean if slots is None else (clean, slots), *reduced[3:])

    def without_mltrace(self, state: dict[str, Any]) -> dict[str, Any]:
        """A copy of ``state`` (the module's ``__dict__``, or its class's pickled state) less
        what mltrace added; ``state`` itself is left as it is."""
        clean = dict(state)
        clean.pop(_REDUCE, None)
        for name in _HOOK_DICTS:
            hooks = clean.get(name)
            if hooks and not self.handle_ids.isdisjoint(hooks):
                copy = type(hooks)(hooks)
                for handle_id in self.handle_ids:
                    copy.pop(handle_id, None)
                clean[name] = copy
        for name, before in self.replaced.items():
            if before is _ABSENT:
                clean.pop(name, None)
            else:
                clean[name] = before
        return clean

    def forget_removed(self, module: torch.nn.Module) -> None:
        """Drop the ids of hooks no longer on ``module`` (handles removed), so that the set does
        not grow with every re-installation of the callbacks."""
        live: set[int] = set()
        for name in _HOOK_DICTS:
            live.update(getattr(module, name, None) or ())
        self.handle_ids &= live


def _reducer(module: torch.nn.Module) -> _ReduceWithoutMltrace:
    """The module's reducer, installed on first use."""
    reducer = vars(module).get(_REDUCE)
    if not isinstance(reducer, _ReduceWithoutMltrace):
        reducer = _ReduceWithoutMltrace(module)
        object.__setattr__(module, _REDUCE, reducer)  # not Module.__setattr__: a plain attribute
    return reducer


def forward_hook(module: torch.nn.Module, fn: Callable[..., Any], prepend: bool = False,
                 with_kwargs: bool = False) -> RemovableHandle:
    """``module.register_forward_hook(fn)``, left out when the module is pickled or copied
    (``with_kwargs``: ``fn(module, args, kwargs, output)``)."""
    handle = module.register_forward_hook(fn, prepend=prepend, with_kwargs=with_kwargs)
    _remember(module, handle)
    return handle


def forward_pre_hook(module: torch.nn.Module, fn: Callable[..., Any], prepend: bool = False,
                     with_kwargs: bool = False) -> RemovableHandle:
    """``module.register_forward_pre_hook(fn)``, left out when the module is pickled or copied
    (``with_kwargs``: ``fn(module, args, kwargs)``)."""
    handle = module.register_forward_pre_hook(fn, prepend=prepend, with_kwargs=with_kwargs)
    _remember(module, handle)
    return handle


def _remember(module: torch.nn.Module, handle: RemovableHandle) -> None:
    reducer = _reducer(module)
    reducer.forget_removed(module)
    reducer.handle_ids.add(handle.id)


def replace_attribute(module: torch.nn.Module, name: str, value: Any) -> None:
    """Set the instance attribute ``name`` of ``module`` (``forward``, say) to ``value``; a
    pickled or copied module gets the value it had before (or none, if it had none)."""
    reducer = _reducer(module)
    if name not in reducer.replaced:
        reducer.replaced[name] = vars(module).get(name, _ABSENT)
    object.__setattr__(module, name, value)


def tensor_hook(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` marked as a tensor hook that is never serialized (torch drops tensor hooks when it
    pickles a parameter, and warns unless they carry this mark)."""
    fn.__torch_unserializable__ = True  # type: ignore[attr-defined]
    return fn
