"""The calibrated state of a prepared model's observers, taken from one prepare and given to
another prepare of the same model: one calibration serving every input size of a model.

A model captured at two input sizes (``torch.export`` at 540 x 960 and at 1080 x 1920, say)
prepares to two graphs that differ in their shapes alone: the same ops in the same order, the
same observers. What calibration records is per tensor (a min and a max, a histogram of
values), not per pixel, so the ranges observed at one size are ranges at every size.
``observer_states`` reads them from the calibrated prepare; ``load_observer_states`` writes them
into the other, which then converts to the same quantization parameters, weights and biases
included, without running any calibration sample at its own size.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

import torch
from torch.fx import GraphModule, Node

from etkit_quant.graph import target_name

# What torchao's prepare_pt2e names the observer (or fake quantize) modules it inserts.
_OBSERVER_PREFIX: Final = "activation_post_process_"


@dataclass(frozen=True)
class ObserverState:
    """One observer of a prepared model: its module's name, its class, what it observes (the op
    of the node it reads, ``placeholder`` for an input or ``get_attr`` for a constant) and its
    state (``state_dict``, copied)."""

    name: str
    kind: str
    observes: str
    state: dict[str, torch.Tensor]


@dataclass(frozen=True)
class ObserverStates:
    """Every observer of a prepared model, in the order its graph calls them."""

    observers: tuple[ObserverState, ...]

    def __len__(self) -> int:
        return len(self.observers)


def _observed(module: GraphModule) -> list[tuple[str, torch.nn.Module, str]]:
    """The observer calls of ``module``'s graph: the module's name, the module, and what the
    node it reads is (its op's name, or the node kind for inputs and constants)."""
    found: list[tuple[str, torch.nn.Module, str]] = []
    seen: set[str] = set()
    for node in module.graph.nodes:
        if node.op != "call_module" or not str(node.target).startswith(_OBSERVER_PREFIX):
            continue
        name = str(node.target)
        if name in seen:  # a shared observer is called more than once
            continue
        seen.add(name)
        source = node.args[0] if node.args else None
        observes = (target_name(source) or source.op) if isinstance(source, Node) else "a constant"
        found.append((name, module.get_submodule(name), observes))
    return found


def observer_states(prepared: GraphModule) -> ObserverStates:
    """The state of every observer of ``prepared`` (a model ``prepare_pt2e`` made, calibrated),
    copied: later calibration or conversion of ``prepared`` leaves it as it is."""
    return ObserverStates(
        tuple(
            ObserverState(
                name,
                type(observer).__name__,
                observes,
                {k: v.detach().clone() for k, v in observer.state_dict().items()},
            )
            for name, observer, observes in _observed(prepared)
        )
    )


def load_observer_states(prepared: GraphModule, states: ObserverStates) -> None:
    """Writes ``states`` (``observer_states`` of another prepare of the same model) into the
    observers of ``prepared``, every buffer of their state (``eps`` included, which torchao's
    own loading skips), so that converting it gives the quantization parameters that
    calibration gave the other. Raises ``ValueError`` naming the first difference when the two
    prepares do not have the same observers (count, names, kinds, what each observes, the shapes
    of their states): the graphs then differ in more than their shapes."""
    mine = _observed(prepared)
    if len(mine) != len(states):
        raise ValueError(
            f"the model prepares to {len(mine)} observers here and {len(states)} where it was "
            "calibrated: its graph differs between the two input sizes in more than its shapes"
        )
    for (name, observer, observes), given in zip(mine, states.observers, strict=True):
        kind = type(observer).__name__
        if (name, kind, observes) != (given.name, given.kind, given.observes):
            raise ValueError(
                f"observer {name} ({kind} of {observes}) was {given.name} ({given.kind} of "
                f"{given.observes}) where the model was calibrated: its graph differs between "
                "the two input sizes in more than its shapes"
            )
        current = observer.state_dict()
        for key, value in given.state.items():
            here = current.get(key)
            if here is not None and here.numel() and here.shape != value.shape:
                raise ValueError(
                    f"observer {name} ({kind} of {observes}) holds {key} of shape "
                    f"{list(here.shape)} here and {list(value.shape)} where the model "
                    "was calibrated"
                )
        observer.load_state_dict({k: v.clone() for k, v in given.state.items()}, strict=False)
        # torchao's observers load their min and max (and histogram) and skip the rest of
        # their buffers: ``eps``, the smallest scale they give (XNNPACK's quantizer sets 2**-12,
        # where the default is float32's epsilon), stayed the default, and a weight of this
        # size got another scale than the calibrated size gave it.
        loaded = observer.state_dict()
        for key, value in given.state.items():
            here = loaded.get(key)
            if here is not None and torch.equal(here, value):
                continue
            # a fake quantize's own observer's buffers are named through it
            owner_name, _, leaf = key.rpartition(".")
            owner = observer.get_submodule(owner_name) if owner_name else observer
            if leaf in owner._buffers:
                owner.register_buffer(leaf, value.clone())
