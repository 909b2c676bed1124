"""``@frozen``: the frozen dataclass gpuops passes its typed values in, built with half the work.

Facts, plans, verdicts and results cross gpuops' modules as frozen dataclasses (over 150 classes).
On Python 3.10-3.12, ``@dataclass(frozen=True)`` compiles six methods for each class, each by its own
``exec`` of generated source: ``__init__``, ``__setattr__`` and ``__delattr__`` (which refuse
assignment), ``__eq__``, ``__hash__`` and ``__repr__``. Building the 84 that ``gpuops inspect``
loads took 56 of the 110 ms of its own imports (docs/speed.md), paid by every command before it
reaches a host. ``frozen`` lets ``dataclasses`` generate the first three, which depend on the
class's fields, and gives every such class the same ``__eq__``, ``__hash__`` and ``__repr__``, written
once here: they read the class's fields when called and mean exactly what the generated ones mean
(the same fields compared, hashed and shown, as ``field(compare=, hash=, repr=)`` selects them; a
method the class body defines itself is kept, as ``dataclasses`` keeps it).

A class made so is a dataclass in every other way: ``dataclasses.fields``, ``replace``, ``asdict`` and
``is_dataclass`` work on it, and type checkers read it as a frozen dataclass (``dataclass_transform``).
"""

from __future__ import annotations

import dataclasses
import functools
import reprlib
from typing import TYPE_CHECKING, Any, Callable, TypeVar

if TYPE_CHECKING:
    from typing_extensions import dataclass_transform
else:
    def dataclass_transform(**_: object) -> Callable[[Any], Any]:
        """Only type checkers read it (``typing`` has it from Python 3.11, gpuops runs on 3.10)."""
        return lambda decorator: decorator

_Class = TypeVar("_Class", bound=type)


@dataclass_transform(frozen_default=True, field_specifiers=(dataclasses.field, dataclasses.Field))
def frozen(cls: _Class) -> _Class:
    """``@dataclass(frozen=True)``, with the shared ``__eq__``, ``__hash__`` and ``__repr__``."""
    own = cls.__dict__
    has_eq, has_repr = "__eq__" in own, "__repr__" in own
    # As dataclasses decides: a __hash__ the body sets is kept, but not the None Python puts there
    # for a body that defines __eq__ alone.
    own_hash = own.get("__hash__", dataclasses.MISSING)
    has_hash = not (own_hash is dataclasses.MISSING or (own_hash is None and has_eq))
    made: Any = dataclasses.dataclass(frozen=True, eq=False, repr=False)(cls)  # cls itself, made a dataclass
    if not has_eq:
        made.__eq__ = _eq
    if not has_hash:
        made.__hash__ = _hash
    if not has_repr:
        made.__repr__ = _repr
    return made


@functools.cache  # per class, once: the fields a class has never change
def _names(cls: type) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    """The fields a class compares, hashes and shows, in order."""
    fields = dataclasses.fields(cls)
    return (tuple(f.name for f in fields if f.compare),
            tuple(f.name for f in fields if (f.compare if f.hash is None else f.hash)),
            tuple(f.name for f in fields if f.repr))


def _eq(self: Any, other: Any) -> Any:
    if other.__class__ is not self.__class__:
        return NotImplemented
    compared = _names(self.__class__)[0]
    # Tuples, as the generated method compares them (an object is equal to itself, NaN included).
    return tuple(getattr(self, n) for n in compared) == tuple(getattr(other, n) for n in compared)


def _hash(self: Any) -> int:
    return hash(tuple(getattr(self, n) for n in _names(self.__class__)[1]))


@reprlib.recursive_repr()
def _repr(self: Any) -> str:
    shown = _names(self.__class__)[2]
    return f"{self.__class__.__qualname__}({', '.join(f'{n}={getattr(self, n)!r}' for n in shown)})"
