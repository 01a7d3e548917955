"""``promoted_constants``: an integer constant meeting a float tensor in an elementwise op becomes
the float constant type promotion computes with: the values do not change, and ExecuTorch 1.5.1's
Arm lowering (VGF, TOSA), which stops at the mixed op once quantized, goes through."""

from __future__ import annotations

import pytest
import torch

from etkit_quant.normalize import normalize_program


class IntegerConstants(torch.nn.Module):
    """The Model Gym's ``catmull_rom_warp`` ends in ``torch.maximum(out, torch.tensor(0))``; an
    integer offset table added to floats; a ``where`` whose condition stays bool."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 3, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv(x) * x
        y = torch.maximum(y, torch.tensor(0))
        y = y + torch.tensor([[[1]], [[2]], [[3]]])
        return torch.where(y > 1.5, y, torch.tensor(7))


def _inputs() -> tuple[torch.Tensor]:
    return (torch.randn(1, 3, 4, 5, generator=torch.Generator().manual_seed(2)),)


def _exported() -> tuple[torch.nn.Module, torch.export.ExportedProgram]:
    torch.manual_seed(0)
    model = IntegerConstants().eval()
    return model, torch.export.export(model, _inputs(), strict=True)


def _integer_constants(program: torch.export.ExportedProgram) -> list[str]:
    """The integer constants the program's ops read."""
    module = program.module(check_guards=False)
    found = []
    for node in module.graph.nodes:
        if node.op == "get_attr" and node.users:
            value = module
            for part in str(node.target).split("."):
                value = getattr(value, part)
            if not value.dtype.is_floating_point:
                found.append(node.name)
    return found


def test_integer_constants_of_float_ops_become_float_and_nothing_changes() -> None:
    model, exported = _exported()
    assert len(_integer_constants(exported)) == 3
    normalized, report = normalize_program(exported, _inputs())
    assert report.steps["promoted_constants"] == 3
    assert _integer_constants(normalized) == []
    with torch.no_grad():
        assert torch.equal(normalized.module()(*_inputs()), model(*_inputs()))


def _lower_for_tosa(program: torch.export.ExportedProgram) -> None:
    """The stock Arm flow to TOSA (the VGF backend's passes, without its converter), the
    profile etkit's VGF exports use: INT+FP keeps partial binary q/dq as VGF does."""
    from executorch.backends.arm.quantizer import TOSAQuantizer, get_symmetric_quantization_config
    from executorch.backends.arm.tosa.compile_spec import TosaCompileSpec
    from executorch.backends.arm.tosa.partitioner import TOSAPartitioner
    from executorch.exir import to_edge_transform_and_lower
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    spec = TosaCompileSpec("TOSA-1.0+INT+FP+int16")
    quantizer = TOSAQuantizer(spec)
    quantizer.set_global(get_symmetric_quantization_config())
    prepared = prepare_pt2e(program.module(check_guards=False), quantizer)
    prepared(*_inputs())
    converted = torch.export.export(convert_pt2e(prepared), _inputs(), strict=True)
    to_edge_transform_and_lower(converted, partitioner=[TOSAPartitioner(spec)])


@pytest.mark.slow
def test_upstream_arm_lowering_stops_at_an_integer_constant_of_a_quantized_float_op() -> None:
    """ExecuTorch 1.5.1: ``FoldAndAnnotateQParamsPass`` keeps the quantize after the mixed op yet
    gives the op its parameters, ``InsertRescaleInt32Pass`` rescales its result to int8, and the
    kept quantize then reads int8. When this test fails, upstream lowers the mixed op (the step
    stays harmless)."""
    _, exported = _exported()
    with pytest.raises(Exception) as caught:
        _lower_for_tosa(exported)
    chain, error = [], caught.value
    while error is not None:
        chain.append(str(error))
        error = error.__cause__ or error.__context__  # type: ignore[assignment]
    assert any("Expecting input to have dtype torch.float32" in text for text in chain)
    normalized, _ = normalize_program(exported, _inputs())
    _lower_for_tosa(normalized)
