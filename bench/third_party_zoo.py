"""The third-party zoo, one function at a time: etkit's ``export_model(verify=True)`` against the
stock ExecuTorch 1.5.1 flow, for XNNPACK and VGF; prints the table rows of
``bench/results/third_party.md``.

Run on demand (not in CI; each export takes 20-120 s here):
    .venv/bin/python bench/third_party_zoo.py [--target xnnpack|vgf] [NAME ...]

Stock flow: what a user of ExecuTorch writes without etkit: ``torch.export``, PT2E with the
target's quantizer (symmetric int8), ``to_edge_transform_and_lower`` with its partitioner,
``to_executorch``; the program run in ``executorch.runtime`` (XNNPACK) or etkit's runner (VGF:
its VGF delegates on Vulkan), its output compared with the float model (PSNR).
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent


def _zoo() -> Any:
    spec = importlib.util.spec_from_file_location(
        "third_party_models", ROOT / "tests/third_party_models.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["third_party_models"] = module
    spec.loader.exec_module(module)
    return module


def _psnr(actual: torch.Tensor, reference: torch.Tensor) -> float:
    mse = float(((actual.double() - reference.double()) ** 2).mean())
    peak = float(reference.max() - reference.min()) or 1.0
    return math.inf if mse == 0 else 10 * math.log10(peak * peak / mse)


def stock(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...], target: str) -> str:
    """The stock flow's verdict on ``model``: its PSNR against the float model, or the error."""
    import executorch.kernels.quantized  # noqa: F401  (the Q/DQ kernels around delegates)
    from executorch.exir import to_edge_transform_and_lower
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    if target == "vgf":
        from executorch.backends.arm.quantizer import (
            VgfQuantizer,
            get_symmetric_quantization_config,
        )
        from executorch.backends.arm.vgf import VgfCompileSpec, VgfPartitioner

        from etkit_exporter.vgf.tools import configure_model_converter

        configure_model_converter()
        spec = VgfCompileSpec("TOSA-1.0+INT+FP+int16")
        quantizer: Any = VgfQuantizer(spec)
        quantizer.set_global(get_symmetric_quantization_config())
        partitioner: Any = VgfPartitioner(spec)
    else:
        from executorch.backends.xnnpack.partition.xnnpack_partitioner import (
            XnnpackPartitioner,
        )
        from executorch.backends.xnnpack.quantizer.xnnpack_quantizer import (
            XNNPACKQuantizer,
            get_symmetric_quantization_config,
        )

        quantizer = XNNPACKQuantizer().set_global(get_symmetric_quantization_config())
        partitioner = XnnpackPartitioner()
    try:
        captured = torch.export.export(model, inputs, strict=True)
        prepared = prepare_pt2e(captured.module(check_guards=False), quantizer)
        prepared(*inputs)
        converted = torch.export.export(convert_pt2e(prepared), inputs, strict=True)
        manager = to_edge_transform_and_lower(converted, partitioner=[partitioner])
        program = manager.to_executorch().buffer
        with tempfile.TemporaryDirectory() as folder:
            pte = Path(folder) / "model.pte"
            pte.write_bytes(program)
            if target == "vgf":
                from etkit_exporter.programs import load_program

                outputs = list(load_program(pte).run(list(inputs)).outputs)
            else:
                from executorch.runtime import Runtime

                method = Runtime.get().load_program(pte).load_method("forward")
                outputs = list(method.execute(list(inputs)))
    except Exception as error:  # the verdict is the error's first line
        return f"fails: {type(error).__name__}: {str(error).splitlines()[0][:120]}"
    with torch.no_grad():
        expected = model(*inputs)
    return f"exports, {_psnr(outputs[0].float(), expected):.1f} dB"


def etkit(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...], target: str) -> str:
    from etkit_exporter import export_model

    with tempfile.TemporaryDirectory() as folder:
        try:
            result = export_model(
                model, inputs, artifacts_root=Path(folder) / "x", target=target, verify=True
            )
        except Exception as error:
            return f"fails: {type(error).__name__}: {str(error).splitlines()[0][:120]}"
    verification = result.verification or {}
    found = [
        c
        for c in verification.get("comparisons", [])
        if c["reference"] == "float model" and c["output"] == 0
    ]
    db = found[0]["psnr_db"] if found else None
    return "verified" + ("" if db is None else f", {db:.1f} dB")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", choices=("xnnpack", "vgf"), action="append")
    parser.add_argument("names", nargs="*")
    args = parser.parse_args()
    zoo = _zoo()
    targets = args.target or list(zoo.TARGETS)
    for name in args.names or list(zoo.THIRD_PARTY_MODELS):
        case = zoo.THIRD_PARTY_MODELS[name]
        cells = []
        for target in targets:
            model, inputs = case.make()
            start = time.perf_counter()
            ours = case.refused.get(target) or etkit(model.eval(), inputs, target)
            theirs = stock(model.eval(), inputs, target)
            cells += [ours, theirs]
            print(f"# {name} {target}: {time.perf_counter() - start:.0f} s", file=sys.stderr)
        print(f"| `{case.function}` ({name}) | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
