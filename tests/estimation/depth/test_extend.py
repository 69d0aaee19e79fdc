"""A three-layer log played at other depths (memlab.estimation.depth.extend), on logs written here by hand: a model
of ``depth`` layers whose forward saves each layer's output, reads the previous one's, and frees temporaries; whose
backward frees what forward saved and what the layer after it passed back; and whose optimizer makes, for each
parameter, a step counter from nothing and a moment from the parameter. A log of three layers, carried to depth D,
must be the log of D layers, event for event."""

from __future__ import annotations

import pytest

from memlab.estimation.depth.extend import NotRepeating, canonical, extend
from memlab.estimation.depth.log import NO_LAYER, Event, LayerPaths, Storage

PATHS = LayerPaths("layers", "Net")


def _log(depth: int, *, extra_in_last: bool = False, grows_outside: bool = False, prefetch: bool = False
         ) -> list[Event]:
    events: list[Event] = []

    def made(storage: Storage, nbytes: int, module: str, context: int | None, consumer: str = "A") -> Storage:
        events.append(Event(consumer, "alloc", id(storage), nbytes, "activations", module, context, storage))
        return storage

    def used(op: str, storage: Storage, module: str, context: int | None, consumer: str = "A") -> None:
        events.append(Event(consumer, op, id(storage), 0, "grads" if op == "move" else "", module, context, storage))

    embedded = made(Storage(NO_LAYER), 64, "embed", None)
    outputs = [embedded]
    for layer in range(depth):
        module = f"layers.{layer}"
        output = made(Storage(layer), 32, module, layer)
        temporary = made(Storage(layer), 8, f"{module}.mlp", layer)
        used("free", temporary, f"{module}.mlp", layer)
        events.append(Event("L", "check", module=module, context=layer))
        used("move", outputs[-1], module, layer, "A")  # reads the layer before it (or the embedding)
        if extra_in_last and layer == depth - 1:
            made(Storage(layer), 16, module, layer)
        outputs.append(output)
    head = made(Storage(NO_LAYER), 128, "head", None)
    if grows_outside:
        for _ in range(depth):  # work outside the layers that grows with the depth: not one layer's
            used("free", made(Storage(NO_LAYER), 4, "", None), "", None)
    used("free", head, "head", None)
    passed = made(Storage(NO_LAYER), 32, "head", None)
    fetched = None
    for layer in reversed(range(depth)):
        module = f"layers.{layer}"
        gradient = made(Storage(layer), 32, module, layer)
        used("free", outputs[layer + 1], module, layer)
        used("free", passed, module, layer)  # what the layer after it (or the head) passed back
        passed = gradient
        if prefetch:  # as FSDP2: a buffer for the layer two before (the embedding's for the second layer)
            if fetched is not None:
                used("free", fetched, module, layer)
            fetched = made(Storage(layer), 64 if layer == 1 else 24, module, layer)
    used("free", passed, "embed", None)
    for layer in range(depth):
        made(Storage(None), 4, "", None)  # a step counter, made from nothing
        made(Storage(layer), 32, "", None)  # a moment, made from the layer's parameter
    events.append(Event("A", "read"))
    return events


@pytest.mark.parametrize("depth", [2, 4, 7])
def test_three_layers_played_at_a_depth_are_the_log_of_that_depth(depth: int) -> None:
    carried = extend(_log(3), depth, PATHS)
    for consumer in ("A", "L"):
        assert canonical(carried, consumer) == canonical(_log(depth), consumer)
    modules = {event.module for event in carried}
    assert {f"layers.{layer}" for layer in range(depth)} <= modules
    assert not any(name.startswith(f"layers.{depth}") for name in modules)


@pytest.mark.parametrize("depth", [4, 6, 9])
def test_work_two_layers_ahead_is_played_from_five_layers(depth: int) -> None:
    """FSDP2's backward prefetches the layer two before: the second layer's buffer is the embedding's size, so its
    run is not every middle layer's. Two first and two last layers played as themselves carry it."""
    carried = extend(_log(5, prefetch=True), depth, PATHS, edge=2)
    assert canonical(carried, "A") == canonical(_log(depth, prefetch=True), "A")
    with pytest.raises(NotRepeating, match="layers 1 and 2 differ"):
        extend(_log(3, prefetch=True), depth, PATHS)


def test_three_layers_at_three_are_themselves() -> None:
    assert canonical(extend(_log(3), 3, PATHS), "A") == canonical(_log(3), "A")


def test_a_last_layer_that_differs_is_refused() -> None:
    with pytest.raises(NotRepeating, match="layers 1 and 2 differ"):
        extend(_log(3, extra_in_last=True), 5, PATHS)


def test_work_outside_the_layers_that_grows_with_depth_shows_against_the_two_layer_log() -> None:
    """Events of no layer are played once: where their number grows with the depth, the log carried to two layers
    is not the two-layer log, which is how a dry run finds out (memlab.estimation.depth.carry.carried_trial)."""
    carried = extend(_log(3, grows_outside=True), 2, PATHS)
    assert canonical(carried, "A") != canonical(_log(2, grows_outside=True), "A")


def test_events_of_a_middle_layer_alone_are_refused() -> None:
    log = _log(3)
    alone = Storage(1)
    log.append(Event("A", "alloc", id(alone), 8, module="", storage=alone))
    with pytest.raises(NotRepeating, match="middle layer alone"):
        extend(log, 5, PATHS)


def test_a_storage_of_a_layer_two_back_is_refused_where_the_model_is_too_shallow() -> None:
    log = _log(3)
    first = next(event.storage for event in log if event.module == "layers.0" and event.op == "alloc")
    assert first is not None
    log.insert(len(log) - 1, Event("A", "move", id(first), 0, "grads", "layers.2", 2, first))
    with pytest.raises(NotRepeating):
        extend(log, 2, PATHS)


def test_frees_in_one_batch_compare_in_any_order() -> None:
    one, two = Storage(None), Storage(None)
    made = [Event("A", "alloc", 1, 8, storage=one), Event("A", "alloc", 2, 8, storage=two)]
    forward = made + [Event("A", "free", 1, storage=one), Event("A", "free", 2, storage=two)]
    backward = made + [Event("A", "free", 2, storage=two), Event("A", "free", 1, storage=one)]
    assert canonical(forward, "A") == canonical(backward, "A")
    assert canonical(forward, "A") != canonical(made + [Event("A", "free", 1, storage=one)], "A")
