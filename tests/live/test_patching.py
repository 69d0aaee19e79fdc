"""memlab.live.patching.patched: what it sets is there inside the block, and the owner is exactly as it was after,
whatever the owner (an object, a class, a module, a torch module) and however the block ends."""

from __future__ import annotations

import types

import pytest
import torch
from torch import nn

from memlab.live.patching import patched


class _Base:
    def forward(self) -> str:
        return "base"


class _Child(_Base):
    pass


class _WithProperty:
    def __init__(self) -> None:
        self._size = 1

    @property
    def size(self) -> int:
        return self._size

    @size.setter
    def size(self, value: int) -> None:
        self._size = value


class _Slotted:
    __slots__ = ("value",)


def test_an_own_attribute_gets_the_very_object_back_and_a_new_one_is_deleted() -> None:
    held = [1, 2]
    owner = types.SimpleNamespace(items=held)
    with patched(owner, items=[3], extra="new"):
        assert owner.items == [3] and owner.extra == "new"
    assert owner.items is held and vars(owner) == {"items": held}


def test_what_was_set_in_between_is_overwritten_and_a_deleted_new_name_is_fine() -> None:
    owner = types.SimpleNamespace(value=1)
    with patched(owner, value=2, extra=0):
        owner.value = 5
        del owner.extra
    assert vars(owner) == {"value": 1}


def test_the_block_raising_still_puts_everything_back() -> None:
    owner = types.SimpleNamespace(a=1)
    with pytest.raises(ValueError, match="inside"), patched(owner, a=2, b=3):
        raise ValueError("inside")
    assert vars(owner) == {"a": 1}


def test_a_failing_set_puts_back_what_was_already_set() -> None:
    class ReadOnly:
        @property
        def fixed(self) -> int:
            return 1

    read_only = ReadOnly()
    with pytest.raises(AttributeError), patched(read_only, before=1, fixed=2):
        pass
    assert vars(read_only) == {}


def test_an_inherited_method_shows_through_again() -> None:
    child = _Child()
    with patched(child, forward=lambda: "patched"):
        assert child.forward() == "patched"
    assert child.forward() == "base" and vars(child) == {}


def test_a_class_attribute_inherited_by_a_class_is_uncovered_and_an_own_one_restored() -> None:
    with patched(_Child, forward=lambda self: "patched"):
        assert _Child().forward() == "patched"
    assert "forward" not in vars(_Child) and _Child().forward() == "base"
    original = vars(_Base)["forward"]
    with patched(_Base, forward=lambda self: "patched"):
        assert _Child().forward() == "patched"
    assert vars(_Base)["forward"] is original


def test_a_property_and_a_slot_are_set_back_through_the_class() -> None:
    owner = _WithProperty()
    with patched(owner, size=4):
        assert owner.size == 4
    assert owner.size == 1 and "size" not in vars(owner)
    slotted = _Slotted()
    slotted.value = 1
    with patched(slotted, value=2):
        assert slotted.value == 2
    assert slotted.value == 1
    empty = _Slotted()
    with patched(empty, value=2):
        assert empty.value == 2
    assert not hasattr(empty, "value")


def test_a_torch_module_keeps_its_submodule_and_its_forward() -> None:
    model = nn.Sequential(nn.Linear(2, 2))
    layer = model[0]
    with patched(model, forward=lambda x: x), patched(layer, weight=nn.Parameter(torch.zeros(2, 2))):
        assert model(torch.ones(1, 2)).tolist() == [[1.0, 1.0]] and layer.weight.abs().sum() == 0
    assert "forward" not in vars(model) and model[0] is layer and layer.weight.abs().sum() > 0


def test_a_module_global_is_put_back() -> None:
    module = types.ModuleType("scratch")
    module.value = 1
    with patched(module, value=2, other=3):
        assert (module.value, module.other) == (2, 3)
    assert module.value == 1 and not hasattr(module, "other")


def test_values_are_put_back_in_the_reverse_order() -> None:
    order: list[str] = []

    class Recording:
        def __setattr__(self, name: str, value: object) -> None:
            if value == "before":
                order.append(name)
            object.__setattr__(self, name, value)

    owner = Recording()
    owner.a = owner.b = "before"
    order.clear()
    with patched(owner, a=1, b=2):
        pass
    assert order == ["b", "a"]
