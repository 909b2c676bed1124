"""``@frozen`` (src/gpuops/frozen.py) means what ``@dataclass(frozen=True)`` means: each behaviour is
checked side by side on a twin class made by ``dataclasses`` itself; and its ``__eq__``, ``__hash__``
and ``__repr__`` are the shared ones, not methods compiled for the class (the import-time saving)."""

from __future__ import annotations

import copy
import dataclasses
import math
import pickle
from dataclasses import dataclass, field
from typing import Any

import pytest

from gpuops import frozen as frozen_module
from gpuops.frozen import frozen


@frozen
class Point:
    """Two fields shown, compared and hashed, one of each kind left out."""

    x: int
    y: float = 0.0
    note: str = field(default="", compare=False)
    secret: str = field(default="", repr=False)
    tags: tuple[str, ...] = field(default=(), hash=False)


@dataclass(frozen=True)
class Twin:
    x: int
    y: float = 0.0
    note: str = field(default="", compare=False)
    secret: str = field(default="", repr=False)
    tags: tuple[str, ...] = field(default=(), hash=False)


@frozen
class Child(Point):
    z: int = 0


@frozen
class Node:
    name: str
    children: list[Any] = field(default_factory=list)


@frozen
class OwnMethods:
    value: int

    def __eq__(self, other: object) -> bool:
        return isinstance(other, OwnMethods) and other.value % 10 == self.value % 10

    def __repr__(self) -> str:
        return "own"


@frozen
class OwnHash:
    value: int

    def __hash__(self) -> int:
        return 7


@dataclass(frozen=True)
class OwnEqTwin:
    value: int

    def __eq__(self, other: object) -> bool:
        return isinstance(other, OwnEqTwin) and other.value % 10 == self.value % 10


ARGS = [(1, 2.0, "a", "s", ("t",)), (1, 2.0, "b", "s", ("t",)), (1, 2.0, "a", "other", ("u",)), (2, 2.0, "a", "s", ("t",)),
        (1, math.nan, "a", "s", ())]


def _same_shape(text: str) -> str:
    return text.replace("Point(", "X(").replace("Twin(", "X(")


@pytest.mark.parametrize("a", ARGS)
@pytest.mark.parametrize("b", ARGS)
def test_equality_hash_and_repr_are_the_generated_ones(a: tuple, b: tuple) -> None:
    ours_a, ours_b, theirs_a, theirs_b = Point(*a), Point(*b), Twin(*a), Twin(*b)
    assert (ours_a == ours_b) is (theirs_a == theirs_b)
    assert (ours_a != ours_b) is (theirs_a != theirs_b)
    assert (ours_a == ours_a) is (theirs_a == theirs_a)  # the same NaN is equal to itself, as in a tuple
    assert hash(ours_a) == hash(theirs_a)
    assert _same_shape(repr(ours_a)) == _same_shape(repr(theirs_a))


def test_a_frozen_class_refuses_assignment_and_is_a_dataclass() -> None:
    point = Point(1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        point.x = 2  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        del point.x  # type: ignore[misc]
    assert dataclasses.is_dataclass(point) and [f.name for f in dataclasses.fields(point)] == ["x", "y", "note", "secret", "tags"]
    assert dataclasses.replace(point, x=5) == Point(5)
    assert dataclasses.asdict(Point(1, tags=("a",))) == {"x": 1, "y": 0.0, "note": "", "secret": "", "tags": ("a",)}
    assert pickle.loads(pickle.dumps(Point(3, 1.5))) == Point(3, 1.5) and copy.deepcopy(point) == point
    assert Point(1) != Twin(1) and Point(1) != (1, 0.0)  # another class is never equal
    assert {Point(1, note="a"): 1}[Point(1, note="b")] == 1  # note is not compared, nor hashed


def test_a_subclass_compares_its_own_fields_and_not_its_parents_instances() -> None:
    assert Child(1, z=2) == Child(1, z=2) and Child(1, z=2) != Child(1, z=3)
    assert Child(1) != Point(1) and hash(Child(1, z=2)) == hash((1, 0.0, "", 2))
    assert repr(Child(1, z=2)) == "Child(x=1, y=0.0, note='', tags=(), z=2)"


def test_a_record_inside_itself_is_shown_as_dots() -> None:
    node = Node("root")
    node.children.append(node)
    assert repr(node) == "Node(name='root', children=[...])"


def test_methods_the_class_defines_are_kept_and_hash_follows_dataclasses_rules() -> None:
    assert OwnMethods(3) == OwnMethods(13) and repr(OwnMethods(3)) == "own"
    assert hash(OwnHash(1)) == 7
    # A body with __eq__ alone gets the fields' hash, as dataclasses gives it one.
    assert hash(OwnMethods(3)) == hash((3,)) and hash(OwnEqTwin(3)) == hash((3,))


def test_the_methods_are_shared_not_compiled_per_class() -> None:
    for cls in (Point, Child, Node):
        assert cls.__eq__ is frozen_module._eq
        assert cls.__hash__ is frozen_module._hash
        assert cls.__repr__ is frozen_module._repr
