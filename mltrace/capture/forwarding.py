"""Attributes a front object shows from one of its parts: ``hook.out_dir`` is
``hook.core.out_dir``. A front door that holds its working parts (a Keras callback holding the
framework-neutral hook, an XGBoost callback holding its adapter) declares each such attribute in
one typed, documented line instead of a property of three lines that all read alike; IDEs and
mypy see every name and its type, as they do not through ``__getattr__`` forwarding.

Example:
    >>> class Front:
    ...     out_dir = Forwarded[str]("core", "Where the trial is written.")
    ...     def __init__(self, core): self.core = core
"""

from __future__ import annotations

from typing import Any, Generic, Self, TypeVar, overload

T = TypeVar("T")


class Forwarded(Generic[T]):
    """The attribute of the same name of ``obj.<part>``, read-only unless ``settable``.

    Args:
        part: the attribute of the front object that holds the part (``"core"``).
        doc: the attribute's docstring (what ``help()`` and IDEs show).
        settable: assigning sets the part's attribute (the part validates the value);
            otherwise assigning raises AttributeError, as for a property without a setter.
    """

    def __init__(self, part: str, doc: str, settable: bool = False) -> None:
        self.part = part
        self.settable = settable
        self.name = ""
        self.__doc__ = doc

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> Self: ...

    @overload
    def __get__(self, obj: object, owner: type | None = None) -> T: ...

    def __get__(self, obj: object | None, owner: type | None = None) -> T | Self:
        if obj is None:
            return self
        value: T = getattr(getattr(obj, self.part), self.name)
        return value

    def __set__(self, obj: object, value: Any) -> None:
        if not self.settable:
            raise AttributeError(
                f"{type(obj).__name__}.{self.name} is read-only: it shows {self.part}.{self.name}")
        setattr(getattr(obj, self.part), self.name, value)


__all__ = ["Forwarded"]
