"""Quantization-aware training: ``prepare_qat`` gives a trainable module with the annotations
``quantize`` gives the same model, ``convert_qat`` converts it as ``quantize`` converts, with the
parameters training chose; ``prepared_grid_samplers`` and ``replace_grid_samplers`` let a library
above (etkit-gridsampler) put an exact integer sampler in the training graph."""

from __future__ import annotations

import copy
import logging
import operator
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Final

import torch
from torch.fx import GraphModule, Node
from torchao.quantization.pt2e import (
    move_exported_model_to_eval,
    move_exported_model_to_train,
)
from torchao.quantization.pt2e.fake_quantize import (
    FakeQuantize,
    FakeQuantizeBase,
    FixedQParamsFakeQuantize,
    FusedMovingAvgObsFakeQuantize,
)
from torchao.quantization.pt2e.observer import MinMaxObserver, MovingAverageMinMaxObserver
from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_qat_pt2e
from torchao.quantization.pt2e.quantizer import (
    FixedQParamsQuantizationSpec,
    QuantizationSpec,
    QuantizationSpecBase,
    Quantizer,
    SharedQuantizationSpec,
)

from etkit_quant.biases import snap_biases_while_training, unsnap_biases
from etkit_quant.boundary import ANNOTATION_KEY, BoundaryQuantizer, own_constants, user_inputs
from etkit_quant.conv_bn_fold import conv_bn_folds_only_where_they_match
from etkit_quant.graph import (
    attribute,
    is_dequantize,
    is_grid_sampler,
    is_quantize,
    operator_name,
)
from etkit_quant.normalize import MAX_FOLDED_ELEMENTS, normalize_program
from etkit_quant.qat_shapes import PreparedShapes, prepared_shapes
from etkit_quant.qspecs import (
    FixedQParams,
    describe_qspec,
    fixed_qparams,
    is_fixed,
    observed_int8,
    observed_int16,
)
from etkit_quant.quantize import arm_lowering, fit_to_backend
from etkit_quant.samples import check_calibration

logger = logging.getLogger(__name__)

SHAPES_KEY: Final = "etkit_qat_input_shapes"
"""``prepared.meta`` key of the input shapes a prepared module takes (``PreparedShapes``)."""
SAMPLER_KEY: Final = "etkit_qat_grid_sampler"
"""``Node.meta`` key of a grid sampler ``replace_grid_samplers`` replaced: the op it was (its
target and its arguments after the image and the grid), which ``convert_qat`` puts back."""
_TIED_KEY: Final = "etkit_qat_tied"
_CONSTANTS_KEY: Final = "etkit_qat_constants"  # buffers kept out of the state dict
_OBSERVING_KEY: Final = "etkit_qat_observing"
_ARM_KEY: Final = "etkit_qat_arm"  # quantize.arm_lowering

# aten.grid_sampler / grid_sampler_2d's integer codes.
MODE_NAMES: Final[dict[int, str]] = {0: "bilinear", 1: "nearest", 2: "bicubic"}
PADDING_NAMES: Final[dict[int, str]] = {0: "zeros", 1: "border", 2: "reflection"}

_QUANTIZED_DTYPES: Final[dict[torch.dtype, torch.dtype]] = {
    torch.qint8: torch.int8,
    torch.quint8: torch.uint8,
    torch.qint32: torch.int32,
}

OnSample = Callable[[int, int], None]
GraphPass = Callable[[GraphModule], object]


@dataclass(frozen=True, eq=False)
class QatGridSampler:
    """A grid sampler of a module ``prepare_qat`` returned, and the fake quantizes around it.

    ``node`` is the sampler's node in ``prepared.graph``: ``aten.grid_sampler`` (or
    ``grid_sampler_2d``) reading ``node.args[0]`` (the image) and ``node.args[1]`` (the grid),
    or, once replaced, a ``call_module`` of ``replacement`` reading the same two. ``image`` and
    ``grid`` are the fake quantizes whose outputs the sampler reads (``None``: that input is
    float), ``output`` the one that reads its result (``None``: float, or quantized by each
    consumer on its own). Read their parameters at each forward (``fake_quant_params``): an
    observed qspec's change while training. ``image`` may also serve other consumers of the same
    tensor: a replacement reads these modules, never owns or changes them."""

    name: str
    node: Node
    image: FakeQuantizeBase | None
    grid: FakeQuantizeBase | None
    output: FakeQuantizeBase | None
    mode: str  # "bilinear", "nearest" or "bicubic"
    padding_mode: str  # "zeros", "border" or "reflection"
    align_corners: bool
    replacement: str | None = None  # the submodule that computes it, once replaced


SamplerReplacement = Callable[[QatGridSampler], torch.nn.Module | None]
"""What ``replace_grid_samplers`` (and ``prepare_qat(sampler_replacement=...)``) call for each
grid sampler: a module whose ``forward(image, grid)`` computes the sampler on the tensors it
reads (the image and grid fake quantizes' outputs) and returns its float output (the output
fake quantize still follows), or ``None`` to keep PyTorch's float sampler there."""


def prepare_qat(
    model: torch.nn.Module,
    example_inputs: tuple[torch.Tensor, ...],
    quantizer: Quantizer,
    *,
    calibration: Iterable[tuple[torch.Tensor, ...]],
    on_sample: OnSample | None = None,
    passes: Sequence[GraphPass] = (),
    sampler_replacement: SamplerReplacement | None = None,
    dynamic_shapes: Any = None,
) -> QatGraphModule:
    """``model`` prepared for quantization-aware training with ``quantizer``: a trainable
    ``GraphModule`` whose fake quantizes compute what the quantized program will.

    The steps are ``quantize``'s (and etkit-exporter's) before calibration: ``model`` is
    exported (strict, in eval mode, as ``quantize`` exports it; ``model``'s mode is restored),
    normalized (``normalize.normalize_program``) and given ``passes`` (callables run in order
    on the exported ``GraphModule``, as the exporter pads RGB images to RGBA before quantizing;
    the graph is exported again after them); its parameters are copied (the module returned
    trains its own, ``model`` is left as it was); ``quantizer`` (a ``BoundaryQuantizer`` over
    the target's base, VGF's or XNNPACK's configured with ``is_qat=True``) annotates it and
    ``prepare_qat_pt2e`` prepares it in train mode (torchao's ``move_exported_model_to_train``:
    dropout and batch norm as training computes them, a batch norm after a conv simulated
    folded into it, as upstream's QAT does; a conv and its batch norm are quantized as one op).
    Every qspec of a fixed-parameter preset (SNORM images, int16 grids, fixed boundaries)
    becomes a fake quantize with those parameters, which nothing moves; an ``observed_int8`` or
    ``observed_int16`` one (a flow entering the coordinate arithmetic) a fake quantize whose
    observer covers every calibration sample (a ``MinMaxObserver``'s range, as ``quantize``
    calibrates it) and then, while training, every batch it sees, and otherwise follows a
    moving average of each batch's min and max (constant 0.01, as the base's fake quantizes
    observe): a batch beyond the range widens it at once, one within it narrows it by 1 % of
    the difference, so the range follows the data as training moves it, shrinking too (a
    min/max over every training batch would only grow, each outlier making the flow's steps
    coarser for good; a plain moving average would clip the batches that outgrow it).

    A convolution's or linear's float bias (XNNPACK's quantizer leaves biases float; the
    backend quantizes them to int32 when it lowers) is added on the int32 grid of its input's
    and weight's fake-quantize scales, straight through (``biases.snap_biases_while_training``,
    after calibration): the forward adds what the program will add.

    Ranges are initialised by running ``calibration`` (one tuple of inputs per sample, checked
    as ``check_calibration`` checks them; at least one) through the module in eval mode with
    fake quantization off, so each observer sees the float values ``quantize``'s calibration
    sees. ``on_sample(done, total)`` is called after each. Then ``sampler_replacement``, if
    given, is applied (``replace_grid_samplers``).

    The module comes back in train mode. ``prepared.train()`` and ``prepared.eval()`` switch
    dropout and batch norm as torchao's ``move_exported_model_to_train``/``_to_eval`` do;
    ``eval()`` also stops every fake quantize's observer (the eval forward reads the ranges as
    they are, as the converted program will) and ``train()`` restores each as it was (one
    stopped with ``torchao.quantization.pt2e.disable_observer`` while training stays stopped).
    Both return the module. ``convert_qat`` converts it.

    Raises ``TypeError`` for a model that is not a ``torch.nn.Module``, example inputs that are
    not a tuple of tensors, a quantizer that is not a PT2E ``Quantizer`` or a pass or
    replacement that is not callable; ``ValueError`` for a model without trainable parameters,
    no calibration samples or a bad one, qspec counts that do not fit the model, or a base
    quantizer configured for post-training quantization (an observer where QAT needs a fake
    quantize); all before anything is exported, except the last two."""
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    inputs = _check_example_inputs(example_inputs)
    if not isinstance(quantizer, Quantizer):
        raise TypeError(
            "quantizer must be a torchao PT2E Quantizer (a BoundaryQuantizer over VgfQuantizer or "
            f"XNNPACKQuantizer configured with is_qat=True), got {type(quantizer).__name__}"
        )
    if not any(p.requires_grad for p in model.parameters()):
        raise ValueError(
            f"model ({type(model).__name__}) has no parameters to train (none with "
            "requires_grad=True); quantize it without training: etkit_quant.quantize"
        )
    samples = _check_samples(calibration, inputs) if dynamic_shapes is None else None
    if callable(passes) or not all(callable(p) for p in passes):
        raise TypeError("passes must be a sequence of callables taking the GraphModule")
    if sampler_replacement is not None and not callable(sampler_replacement):
        raise TypeError(
            "sampler_replacement must be a callable taking a QatGridSampler and returning a "
            f"torch.nn.Module or None, got {type(sampler_replacement).__name__}"
        )

    graph_module, num_outputs, shapes = _export_for_training(model, inputs, passes, dynamic_shapes)
    if samples is None:  # with dynamic dimensions, samples of other sizes
        captured = tuple(n.meta["val"] for n in user_inputs(graph_module))
        samples = _check_samples(calibration, captured)
    for index, sample in enumerate(samples):
        shapes.check(sample, f"calibration sample {index}")
    own_constants(graph_module)  # trains its own copies: the caller's model stays as it was
    if isinstance(quantizer, BoundaryQuantizer):
        quantizer.check_counts(len(user_inputs(graph_module)), num_outputs)
    prepared: GraphModule = prepare_qat_pt2e(graph_module, _QatQuantizer(quantizer))
    prepared.meta[_TIED_KEY] = _tie_unshared_parameters(prepared)
    prepared.meta[_ARM_KEY] = arm_lowering(quantizer)
    prepared.meta[SHAPES_KEY] = shapes
    _with_class(prepared, QatGraphModule)
    assert isinstance(prepared, QatGraphModule)

    fake_quants = _fake_quants(prepared)
    enabled = {name: bool(fq.fake_quant_enabled[0]) for name, fq in fake_quants.items()}
    prepared.eval()  # dropout off, batch norms on their running statistics; observers stopped
    for fq in fake_quants.values():
        fq.disable_fake_quant()  # observe the float values, as quantize's calibration does
        fq.enable_observer()
    with torch.no_grad():
        for done, sample in enumerate(samples, start=1):
            prepared(*sample)
            if on_sample is not None:
                on_sample(done, len(samples))
    for name, fq in fake_quants.items():
        observer = fq.activation_post_process
        if isinstance(observer, _CalibratedMovingAverageObserver):
            observer.calibrating = False  # from now on, a moving average
        _hold_observed(fq)
        fq.enable_fake_quant(enabled[name])
        fq.disable_observer()  # as eval left them; train() restores each
    snap_biases_while_training(prepared)  # float biases XNNPACK quantizes: as it will
    _keep_learnt_state(prepared, set(model.state_dict()))
    if sampler_replacement is not None:
        replace_grid_samplers(prepared, sampler_replacement)
    prepared.train()
    return prepared


def convert_qat(
    prepared: GraphModule, *, example_inputs: tuple[torch.Tensor, ...] | None = None
) -> GraphModule:
    """The quantized model of a module ``prepare_qat`` returned (trained or not), as
    ``quantize`` returns it: ``convert_pt2e`` of a copy in eval mode, then
    ``fit_to_backend``. Nothing is calibrated again: every
    quantize takes the scale and zero point its fake quantize holds (those its eval forward
    applies), and grid samplers replaced for training are the ``aten`` grid samplers again,
    between the same quantizes.
    ``prepared`` is left as it was: train on, convert again.

    ``example_inputs``: for a module prepared with dynamic dimensions, the quantized model at
    those inputs' shape (which it must take), as ``quantize`` gives it at a fixed size: what
    the graph computes from the inputs' sizes alone (a base grid built from the height and
    width) is folded into constants at that size (``fold_sizes``).

    Raises ``TypeError`` for anything ``prepare_qat`` did not return; ``ValueError`` for
    ``example_inputs`` of a shape it does not take."""
    _check_prepared(prepared)
    if example_inputs is not None:
        shapes = prepared.meta.get(SHAPES_KEY)
        if isinstance(shapes, PreparedShapes):
            shapes.check(example_inputs, "convert_qat's example inputs")
    model = copy.deepcopy(prepared)
    model.eval()
    _with_class(model, GraphModule)  # the converted model is a plain GraphModule, as quantize's
    _restore_grid_samplers(model)
    for name, original in model.meta.pop(_TIED_KEY, ()):
        # Apart again, as the PTQ path's graph has them (a later torch.export keeps them apart).
        value = attribute(model, original)
        model.register_parameter(name, torch.nn.Parameter(value.detach().clone(), False))
    for fq in _fake_quants(model).values():
        _hold_observed(fq)
        _pin_qparams(fq)
    model.meta.pop(_OBSERVING_KEY, None)
    arm = bool(model.meta.pop(_ARM_KEY, False))
    unsnap_biases(model)  # snap_float_biases rounds them again, on the converted scales
    with (
        conv_bn_folds_only_where_they_match()
    ):  # torchao's fold, without patterns that cannot match
        converted: GraphModule = convert_pt2e(model)
    move_exported_model_to_eval(converted)  # (already eval: a no-op kept for the contract)
    fit_to_backend(converted, arm)  # as quantize
    if example_inputs is not None:
        fold_sizes(converted, example_inputs)
    return converted


def fold_sizes(model: GraphModule, example_inputs: tuple[torch.Tensor, ...]) -> list[str]:
    """``model`` (a graph with dynamic dimensions) specialized to ``example_inputs``' shape in
    place: each ``sym_size`` takes its size there, and every node computed from those sizes
    (and constants: an ``arange`` over the height, the base grid stacked from it), never through
    a quantize or a dequantize, becomes one constant (``_size_folded_N``), as a capture at that
    size folds it. What depends on no size (a weight's quantize and dequantize) stays.
    Returns the names of the nodes replaced."""
    sizes = _sizes_read(model, example_inputs)
    known: dict[Node, Any] = dict(sizes)
    derived = set(sizes)  # computed from a size: what a capture at that size folds
    for node in model.graph.nodes:
        if node.op == "get_attr":
            known[node] = attribute(model, str(node.target))
        elif (
            node.op == "call_function"
            and node not in known
            and all(n in known for n in node.all_input_nodes)
            and any(n in derived for n in node.all_input_nodes)
            and _size_foldable(node)
        ):
            args, kwargs = torch.fx.node.map_arg((node.args, node.kwargs), lambda n: known[n])
            with torch.no_grad():
                known[node] = node.target(*args, **kwargs)
            derived.add(node)
    replaced: list[str] = []
    for node in list(model.graph.nodes):
        value = known.get(node)
        if node not in derived or all(user in derived for user in node.users):
            continue
        if isinstance(value, torch.Tensor) and value.numel() <= MAX_FOLDED_ELEMENTS:
            name = _free_attr_name(model, "_size_folded")
            model.register_buffer(name, value.clone(), persistent=False)
            with model.graph.inserting_before(node):
                constant = model.graph.get_attr(name)
            constant.meta["val"] = value
            node.replace_all_uses_with(constant)
        elif isinstance(value, int):
            _read_as(node, value)
        else:
            continue
        replaced.append(node.name)
    if replaced:
        model.graph.eliminate_dead_code()
        model.graph.lint()
        model.recompile()
    return replaced


def _sizes_read(model: GraphModule, example_inputs: tuple[torch.Tensor, ...]) -> dict[Node, int]:
    """The value of every ``sym_size`` of ``model``'s graph on ``example_inputs`` (one forward:
    a size may be read from any tensor, a dequantize of the input as often as the input)."""
    sizes: dict[Node, int] = {}

    class _Reader(torch.fx.Interpreter):
        def run_node(self, n: Node) -> Any:
            value = super().run_node(n)
            if n.op == "call_function" and operator_name(n.target) == "aten::sym_size.int":
                sizes[n] = int(value)
            return value

    if any(operator_name(n.target) == "aten::sym_size.int" for n in model.graph.nodes):
        with torch.no_grad():
            _Reader(model).run(*example_inputs)
    return sizes


def _size_foldable(node: Node) -> bool:
    target = node.target
    if is_quantize(node) or is_dequantize(node):
        return False
    if target in _INT_OPERATORS:
        return True
    if not isinstance(target, torch._ops.OpOverload):
        return False
    return not (target._schema.is_mutable or torch.Tag.nondeterministic_seeded in target.tags)


def _read_as(node: Node, value: int) -> None:
    """Every user of ``node`` reads ``value`` in its place."""
    for user in list(node.users):
        user.args, user.kwargs = torch.fx.node.map_arg(
            (user.args, user.kwargs), lambda n: value if n is node else n
        )


_INT_OPERATORS: Final = frozenset(
    {operator.add, operator.sub, operator.mul, operator.floordiv, operator.truediv, operator.neg}
)


def prepared_grid_samplers(prepared: GraphModule) -> list[QatGridSampler]:
    """Every grid sampler of ``prepared`` (a module ``prepare_qat`` returned), in graph order,
    with the fake quantizes around it: what a replacement needs (``QatGridSampler``)."""
    _check_prepared(prepared)
    modules = dict(prepared.named_modules(remove_duplicate=False))  # shared fake quantizes too
    sites: list[QatGridSampler] = []
    for node in prepared.graph.nodes:
        record = node.meta.get(SAMPLER_KEY)
        if record is not None and node.op == "call_module":
            tail, replacement = record["args"], str(node.target)
        elif node.op == "call_function" and is_grid_sampler(node):
            tail, replacement = node.args[2:], None
        else:
            continue
        mode, padding, align_corners = [*tail, 0, 0, False][:3]
        users = list(node.users)
        output = _fake_quant_of(users[0], modules) if len(users) == 1 else None
        sites.append(
            QatGridSampler(
                name=node.name,
                node=node,
                image=_fake_quant_of(node.args[0], modules),
                grid=_fake_quant_of(node.args[1], modules),
                output=output,
                mode=MODE_NAMES.get(int(mode), str(mode)),
                padding_mode=PADDING_NAMES.get(int(padding), str(padding)),
                align_corners=bool(align_corners),
                replacement=replacement,
            )
        )
    return sites


def replace_grid_samplers(prepared: GraphModule, replacement: SamplerReplacement) -> list[str]:
    """Calls ``replacement`` for each grid sampler of ``prepared`` not yet replaced; where it
    returns a module, that module computes the sampler from then on: it becomes a submodule of
    ``prepared`` (``etkit_grid_sampler_<name>``) and the sampler's node calls it with the image
    and the grid the sampler read (its name and the fake quantizes around it stay). Returns the
    names of the samplers replaced. ``convert_qat`` puts the ``aten`` op back.

    Raises ``TypeError`` for a ``prepared`` that ``prepare_qat`` did not return, a
    ``replacement`` that is not callable, or one that returns something other than a module or
    ``None`` (naming the sampler)."""
    _check_prepared(prepared)
    if not callable(replacement):
        raise TypeError(
            "replacement must be a callable taking a QatGridSampler and returning a "
            f"torch.nn.Module or None, got {type(replacement).__name__}"
        )
    replaced: list[str] = []
    for site in prepared_grid_samplers(prepared):
        if site.replacement is not None:
            continue
        module = replacement(site)
        if module is None:
            continue
        if not isinstance(module, torch.nn.Module):
            raise TypeError(
                f"the replacement for grid sampler {site.name} must be a torch.nn.Module or "
                f"None, got {type(module).__name__}"
            )
        name = _free_attr_name(prepared, f"etkit_grid_sampler_{site.name}")
        prepared.add_submodule(name, module)
        node = site.node
        node.meta[SAMPLER_KEY] = {
            "target": node.target,
            "args": tuple(node.args[2:]),
            "kwargs": dict(node.kwargs),
        }
        node.op, node.target = "call_module", name
        node.args, node.kwargs = tuple(node.args[:2]), {}
        replaced.append(site.name)
        logger.info("grid sampler %s computed by %s", site.name, type(module).__name__)
    if replaced:
        prepared.graph.lint()
        prepared.recompile()
    return replaced


def fake_quant_params(fake_quant: FakeQuantizeBase) -> FixedQParams:
    """The per-tensor parameters ``fake_quant`` applies now: scale (float32, as held), zero
    point, range and integer dtype (``torch.int8``, ``uint8``, ``int16``, ``int32``). Raises
    ``ValueError`` for a per-channel fake quantize, ``TypeError`` for anything else."""
    if not isinstance(fake_quant, FakeQuantize):
        raise TypeError(f"expected a torchao FakeQuantize, got {type(fake_quant).__name__}")
    scale, zero_point = fake_quant.scale, fake_quant.zero_point
    if scale.numel() != 1:
        raise ValueError(f"{type(fake_quant).__name__} is per channel ({scale.numel()} scales)")
    observer = fake_quant.activation_post_process
    dtype = _QUANTIZED_DTYPES.get(fake_quant.dtype, fake_quant.dtype)
    return FixedQParams(
        scale=float(scale.reshape(())),
        zero_point=int(zero_point.reshape(())),
        quant_min=int(observer.quant_min),
        quant_max=int(observer.quant_max),
        dtype=dtype,
    )


# -- preparation --------------------------------------------------------------------------------


def _check_example_inputs(example_inputs: object) -> tuple[torch.Tensor, ...]:
    if not isinstance(example_inputs, tuple):
        raise TypeError(
            f"example_inputs must be a tuple of tensors, got {type(example_inputs).__name__}"
        )
    for k, value in enumerate(example_inputs):
        if not isinstance(value, torch.Tensor):
            raise TypeError(
                f"example_inputs[{k}] must be a torch.Tensor, got {type(value).__name__}"
            )
    return example_inputs


def _check_samples(
    calibration: object, inputs: tuple[torch.Tensor, ...]
) -> list[tuple[torch.Tensor, ...]]:
    what = "calibration must give at least one sample (a tuple of inputs) to initialise the ranges"
    if calibration is None:
        raise ValueError(f"{what}, got None")
    if isinstance(calibration, torch.Tensor | str | bytes) or not isinstance(calibration, Iterable):
        raise TypeError(
            f"{what}, e.g. [(x,)]; got {type(calibration).__name__}"  # one sample: [(x,)]
        )
    samples = list(calibration)
    if not samples:
        raise ValueError(f"{what}; it is empty")
    return check_calibration(samples, inputs)


def _export_for_training(
    model: torch.nn.Module,
    inputs: tuple[torch.Tensor, ...],
    passes: Sequence[GraphPass],
    dynamic_shapes: Any = None,
) -> tuple[GraphModule, int, PreparedShapes]:
    """``model`` exported as ``quantize`` exports it (strict, in eval mode: the graph the PTQ path
    quantizes; with ``dynamic_shapes``, ``torch.export``'s), normalized, with ``passes`` run,
    then moved to train mode by torchao's ``move_exported_model_to_train`` (dropout and batch
    norm as training computes them, in the form ``prepare_qat_pt2e`` folds into the conv
    before a batch norm); its number of user outputs; the input shapes it takes. (Exported in
    train mode, a batch norm writes its running statistics in place, which normalization
    functionalizes out of the form upstream folds.)"""
    was_training = model.training
    model.eval()
    try:
        exported = torch.export.export(model, inputs, dynamic_shapes=dynamic_shapes, strict=True)
    finally:
        model.train(was_training)
    num_outputs = len(exported.graph_signature.user_outputs)
    exported, report = normalize_program(exported, inputs, dynamic_shapes=dynamic_shapes)
    if report.changed:
        logger.info("normalized for QAT: %s", report.summary())
    # torch 2.13 adds a _guards_fn call_module by default, which PT2E quantizers reject.
    graph_module: GraphModule = exported.module(check_guards=False)
    if passes:
        for graph_pass in passes:
            graph_pass(graph_module)
        exported = torch.export.export(
            graph_module, inputs, dynamic_shapes=dynamic_shapes, strict=True
        )
        graph_module = exported.module(check_guards=False)
    move_exported_model_to_train(graph_module)
    return graph_module, num_outputs, prepared_shapes(exported)


def _keep_learnt_state(prepared: GraphModule, model_state: set[str]) -> None:
    """Only what training learns or observes stays in ``prepared.state_dict()``: the model's
    own parameters and buffers (``model_state``: its ``state_dict()`` names) and the fake
    quantizes' state. Constants the capture made (normalization's folded subgraphs, such as
    a base grid built from the input's shape, and lifted tensor constants) are buffers no
    checkpoint holds: they follow from the graph, and one folded from a shape would tie a
    checkpoint to the batch and crop it was captured at."""
    fake_quant_state = {
        f"{name}.{buffer}"
        for name, module in prepared.named_modules()
        if isinstance(module, FakeQuantizeBase)
        for buffer, _ in module.named_buffers()
    }
    constants = [
        name
        for name, _ in prepared.named_buffers()
        if name not in model_state and name not in fake_quant_state
    ]
    prepared.meta[_CONSTANTS_KEY] = constants
    _mark_constants(prepared)
    logger.debug("QAT: constants of the graph, not in the state dict: %s", constants)


def _mark_constants(prepared: GraphModule) -> None:
    """The buffers ``_keep_learnt_state`` named are non-persistent (again: a ``GraphModule``'s
    copy registers every buffer anew)."""
    for name in prepared.meta.get(_CONSTANTS_KEY, ()):
        owner, _, leaf = name.rpartition(".")
        module = prepared.get_submodule(owner) if owner else prepared
        if leaf in module._buffers:
            module._non_persistent_buffers_set.add(leaf)


def _ctr_class(ctr: object) -> object:
    """The class an ``observer_or_fake_quant_ctr`` builds (torchao wraps it in a partial)."""
    inner = getattr(ctr, "p", None)
    return getattr(inner, "func", None) or getattr(ctr, "func", None) or ctr


def _is_fake_quant_ctr(ctr: object) -> bool:
    cls = _ctr_class(ctr)
    if not isinstance(cls, type):
        return False
    if issubclass(cls, FakeQuantizeBase):
        return True
    legacy = getattr(torch.ao.quantization, "FakeQuantizeBase", None)
    return isinstance(legacy, type) and issubclass(cls, legacy)


class _QatQuantizer(Quantizer):  # type: ignore[misc]  # torchao is untyped
    """``inner``'s annotations, with every etkit qspec made a fake quantize: a fixed preset a
    ``FixedQParamsQuantizationSpec`` (PT2E makes it a ``FixedQParamsFakeQuantize`` in QAT), an
    observed one a ``FakeQuantize`` around its observer. Equal qspecs stay equal (one converted
    object each), so PT2E shares observers where it did. A base qspec that only observes means
    the base was configured for PTQ: ``ValueError``."""

    def __init__(self, inner: Quantizer) -> None:
        super().__init__()
        self.inner = inner
        self._converted: dict[QuantizationSpec, QuantizationSpecBase] = {}
        ours: list[QuantizationSpec | None] = [
            observed_int8(),
            observed_int8(full_range=True),
            observed_int16(),
        ]
        if isinstance(inner, BoundaryQuantizer):
            ours += [*inner.input_qspecs, *inner.output_qspecs]
            ours += [
                inner.grid_sampler_image_qspec,
                inner.grid_sampler_grid_qspec,
                inner.grid_sampler_output_qspec,
                inner.coordinate_input_qspec,
            ]
        self._ours = {q for q in ours if q is not None}

    def transform_for_annotation(self, model: GraphModule) -> GraphModule:
        result: GraphModule = self.inner.transform_for_annotation(model)
        return result

    def annotate(self, model: GraphModule) -> GraphModule:
        model = self.inner.annotate(model)
        _conv_bn_as_one(model)
        for node in model.graph.nodes:
            annotation = node.meta.get(ANNOTATION_KEY)
            if annotation is None:
                continue
            for source, qspec in list(annotation.input_qspec_map.items()):
                annotation.input_qspec_map[source] = self._qat(qspec, node)
            annotation.output_qspec = self._qat(annotation.output_qspec, node)
        return model

    def validate(self, model: GraphModule) -> None:
        self.inner.validate(model)

    def prepare_obs_or_fq_callback(
        self, model: GraphModule, edge_or_node_to_obs_or_fq: Any
    ) -> None:
        self.inner.prepare_obs_or_fq_callback(model, edge_or_node_to_obs_or_fq)

    def _qat(self, qspec: object, node: Node) -> Any:
        if not isinstance(qspec, QuantizationSpec) or _is_fake_quant_ctr(
            qspec.observer_or_fake_quant_ctr
        ):
            return qspec  # None, shared, derived (a bias), fixed by torchao, a fake quantize
        if qspec in self._converted:
            return self._converted[qspec]
        converted: QuantizationSpecBase
        if is_fixed(qspec):
            params = fixed_qparams(qspec)
            converted = FixedQParamsQuantizationSpec(
                dtype=qspec.dtype,
                scale=params.scale,
                zero_point=params.zero_point,
                quant_min=params.quant_min,
                quant_max=params.quant_max,
                qscheme=qspec.qscheme,
            )
        elif qspec in self._ours and not qspec.is_dynamic:
            converted = QuantizationSpec(
                dtype=qspec.dtype,
                observer_or_fake_quant_ctr=FakeQuantize.with_args(
                    observer=_training_observer(qspec.observer_or_fake_quant_ctr)
                ),
                quant_min=qspec.quant_min,
                quant_max=qspec.quant_max,
                qscheme=qspec.qscheme,
                ch_axis=qspec.ch_axis,
                is_dynamic=False,
            )
        else:
            raise ValueError(
                f"the quantizer gives {node.name} an observer ({describe_qspec(qspec)}), not a "
                "fake quantize: configure its base for QAT, e.g. "
                "base.set_global(get_symmetric_quantization_config(is_qat=True))"
            )
        self._converted[qspec] = converted
        return converted


class _CalibratedMovingAverageObserver(MovingAverageMinMaxObserver):  # type: ignore[misc]
    """The observer of an observed etkit qspec in QAT. While ``calibrating`` (``prepare_qat``'s
    calibration pass), a ``MinMaxObserver``: the range covers every sample, as ``quantize``'s
    calibration. Then, while training, a moving average that covers each batch: a batch beyond
    the range widens it to the batch's min or max at once (nothing a training forward sees is
    clipped), one within it moves min and max ``averaging_constant`` of the way towards the
    batch's (as torchao's QAT fake quantizes observe), so an outlier's width fades."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calibrating = True

    def forward(self, x_orig: torch.Tensor) -> torch.Tensor:
        if self.calibrating or bool(torch.isinf(self.min_val)) or x_orig.numel() == 0:
            result: torch.Tensor = MinMaxObserver.forward(self, x_orig)
            return result
        low, high = torch.aminmax(x_orig.detach().to(self.min_val.dtype))
        rate = self.averaging_constant
        self.min_val.copy_(torch.minimum(low, self.min_val + rate * (low - self.min_val)))
        self.max_val.copy_(torch.maximum(high, self.max_val + rate * (high - self.max_val)))
        return x_orig


def _training_observer(ctr: object) -> object:
    """The observer an observed etkit qspec's fake quantize trains with: a ``MinMaxObserver``
    becomes ``_CalibratedMovingAverageObserver`` (its arguments kept); any other is kept."""
    if ctr is MinMaxObserver:
        return _CalibratedMovingAverageObserver
    return ctr


_CONV_TARGETS: Final = frozenset(
    {"aten::conv1d", "aten::conv2d", "aten::conv_transpose1d", "aten::conv_transpose2d"}
)


def _conv_bn_as_one(model: GraphModule) -> None:
    """A conv whose only user is a batch norm is one quantized op with it, as upstream's QAT
    folds it (``prepare_qat_pt2e`` simulates the fold, ``convert_pt2e`` folds): nothing is
    quantized between them. (ExecuTorch 1.5.1's Arm quantizer folds an eval-mode batch norm
    into its conv before annotating, but annotates a training one apart from its conv, with a
    quantize between them that keeps ``convert_pt2e`` from folding.)"""
    for node in model.graph.nodes:
        if node.op != "call_function" or operator_name(node.target) not in _CONV_TARGETS:
            continue
        users = list(node.users)
        if len(users) != 1 or operator_name(users[0].target) != "aten::batch_norm":
            continue
        batch_norm = users[0]
        conv_annotation = node.meta.get(ANNOTATION_KEY)
        bn_annotation = batch_norm.meta.get(ANNOTATION_KEY)
        if conv_annotation is None or bn_annotation is None or batch_norm.args[0] is not node:
            continue
        if bn_annotation.output_qspec is None or isinstance(
            bn_annotation.output_qspec, SharedQuantizationSpec
        ):
            continue  # the batch norm's result is not quantized on its own: left as it is
        conv_annotation.output_qspec = None
        bn_annotation.input_qspec_map.pop(node, None)
        logger.debug("QAT: %s and %s quantized as one op", node.name, batch_norm.name)


def _tie_unshared_parameters(prepared: GraphModule) -> list[tuple[str, str]]:
    """``BoundaryQuantizer`` gives an op its own frozen copy of a parameter it shares with
    another op (``<name>_for_<op>``, ``requires_grad=False``), which the PTQ graph needs;
    trained apart, the copies would diverge: each is tied back to the parameter it copies (one
    tensor, trained once). Returns ``(copy, original)`` pairs for ``convert_qat`` to part
    again."""
    parameters = dict(prepared.named_parameters(remove_duplicate=False))
    tied: list[tuple[str, str]] = []
    for node in prepared.graph.nodes:
        target = str(node.target)
        value = parameters.get(target)
        if node.op != "get_attr" or value is None or value.requires_grad:
            continue
        for name, original in parameters.items():
            if (
                name != target
                and target.startswith(name.replace(".", "_") + "_for_")
                and original.requires_grad
                and value.shape == original.shape
                and torch.equal(value, original)
            ):
                owner, _, attr = target.rpartition(".")
                prepared.get_submodule(owner).register_parameter(attr, original)
                tied.append((target, name))
                logger.debug("QAT: %s trains as %s", target, name)
                break
    return tied


def _fake_quants(model: torch.nn.Module) -> dict[str, FakeQuantizeBase]:
    return {n: m for n, m in model.named_modules() if isinstance(m, FakeQuantizeBase)}


def _hold_observed(fq: FakeQuantizeBase) -> None:
    """``fq`` holds the parameters it applies from the statistics its observer has, as its own
    forward derives them: a fused fake quantize (``FusedMovingAvgObsFakeQuantize``, the bases'
    QAT default) derives them in its fused kernel, only while it fake-quantizes (the
    calibration observed with fake quantization off), and not as ``calculate_qparams`` does
    (a symmetric int8 scale of ``max|x| / 127`` there, ``/ 127.5`` in ``calculate_qparams``):
    its kernel runs once, observing nothing. A plain ``FakeQuantize`` derives them whenever it
    observes, so it holds them already."""
    if not isinstance(fq, FusedMovingAvgObsFakeQuantize):
        return
    low = fq.activation_post_process.min_val
    if not isinstance(low, torch.Tensor) or low.numel() == 0 or bool(torch.isinf(low).all()):
        return  # nothing observed (a branch the samples never ran)
    observing, quantizing = int(fq.observer_enabled[0]), int(fq.fake_quant_enabled[0])
    fq.disable_observer()
    fq.enable_fake_quant()
    shape = [1]
    if fq.is_per_channel:  # the channels along ch_axis, as the kernel reads them
        shape = [1] * (max(int(fq.ch_axis), 0) + 2)
        shape[int(fq.ch_axis)] = low.numel()
    with torch.no_grad():
        fq(torch.zeros(shape, device=low.device))
    fq.enable_observer(bool(observing))
    fq.enable_fake_quant(bool(quantizing))


class QatGraphModule(GraphModule):
    """The class of the modules ``prepare_qat`` returns (a ``GraphModule``; a copy, as
    ``copy.deepcopy`` makes, stays one): ``train()`` and ``eval()`` switch dropout and batch
    norm as torchao's ``move_exported_model_to_train``/``_to_eval`` do and set the modules'
    ``training`` flags; ``eval()`` also stops every fake quantize's observer, so an eval
    forward applies the ranges as they are (the converted program's), and ``train()`` restores
    each as it was."""

    def train(self, mode: bool = True) -> QatGraphModule:
        observing: dict[str, bool] | None = self.meta.get(_OBSERVING_KEY)
        fake_quants = _fake_quants(self)
        if mode:
            move_exported_model_to_train(self)
            if observing is not None:
                for name, fq in fake_quants.items():
                    fq.enable_observer(observing.get(name, True))
                self.meta[_OBSERVING_KEY] = None
        else:
            move_exported_model_to_eval(self)
            if observing is None:
                self.meta[_OBSERVING_KEY] = {
                    name: bool(fq.observer_enabled[0]) for name, fq in fake_quants.items()
                }
                for fq in fake_quants.values():
                    fq.disable_observer()
                    _hold_observed(fq)  # what its eval forwards will apply, from now on
        torch.nn.Module.train(self, mode)
        return self

    def eval(self) -> QatGraphModule:
        return self.train(False)

    def __deepcopy__(self, memo: dict[int, Any]) -> QatGraphModule:
        copied = super().__deepcopy__(memo)
        assert isinstance(copied, QatGraphModule)
        _mark_constants(copied)  # (GraphModule's copy registers every buffer as persistent)
        return copied

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # Before any work: a crop or batch the capture does not take is one line naming it.
        shapes = self.meta.get(SHAPES_KEY)
        if isinstance(shapes, PreparedShapes) and not torch.compiler.is_compiling():
            shapes.check(args, "the prepared module's forward")
        return super().__call__(*args, **kwargs)


def _with_class(module: GraphModule, cls: type[GraphModule]) -> None:
    """``module`` made an instance of ``cls`` in place (each GraphModule has a class of its own,
    named ``GraphModuleImpl``, which holds its generated ``forward``)."""
    module.__class__ = type("GraphModuleImpl", (cls,), {})
    for name in ("train", "eval"):  # torchao's refusals, set on the instance by prepare
        module.__dict__.pop(name, None)
    module.recompile()


def _check_prepared(prepared: object) -> None:
    if not isinstance(prepared, QatGraphModule):
        raise TypeError(
            "prepared must be the module etkit_quant.prepare_qat returned, got "
            f"{type(prepared).__name__}"
        )


def _fake_quant_of(node: object, modules: dict[str, torch.nn.Module]) -> FakeQuantizeBase | None:
    if not isinstance(node, Node) or node.op != "call_module":
        return None
    module = modules.get(str(node.target))
    return module if isinstance(module, FakeQuantizeBase) else None


# -- conversion ---------------------------------------------------------------------------------


def _restore_grid_samplers(model: GraphModule) -> None:
    restored = False
    for node in model.graph.nodes:
        record = node.meta.pop(SAMPLER_KEY, None)
        if record is None or node.op != "call_module":
            continue
        name = str(node.target)
        node.op, node.target = "call_function", record["target"]
        node.args, node.kwargs = (*node.args[:2], *record["args"]), record["kwargs"]
        model.delete_submodule(name)
        restored = True
    if restored:
        model.graph.lint()
        model.recompile()


def _pin_qparams(fq: FakeQuantizeBase) -> None:
    """``convert_pt2e`` reads ``calculate_qparams()``, which an observer derives from its
    statistics again; the program takes what the fake quantize holds and applies instead."""
    if not isinstance(fq, FakeQuantize) or isinstance(fq, FixedQParamsFakeQuantize):
        return
    scale, zero_point = fq.calculate_qparams()
    if scale.shape != fq.scale.shape:
        return  # never observed: nothing held
    held = (fq.scale.detach().clone().to(scale.dtype), fq.zero_point.detach().clone())
    held = (held[0], held[1].to(zero_point.dtype))
    if not (torch.equal(held[0], scale) and torch.equal(held[1], zero_point)):
        logger.debug("QAT convert: %s keeps its held parameters", type(fq).__name__)
    fq.calculate_qparams = lambda: held


def _free_attr_name(model: GraphModule, base: str) -> str:
    name, k = base, 1
    while hasattr(model, name):
        name, k = f"{base}_{k}", k + 1
    return name
