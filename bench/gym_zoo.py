"""The Model Gym zoo, every network on both targets: etkit's ``export_model(verify=True)`` on each
of ``tests/gym_models.py``'s networks (Arm's ``ng-model-gym`` 0.4.0 classes), for XNNPACK and VGF;
prints a table: network, target, verified, PSNR against the float model (worst output), export
seconds. ``tests/test_gym_zoo.py`` runs four of them per target in CI; this runs all.

``--anchor`` adds the gym's own export flow beside each export (``gym_flow``): its int8 PTQ VGF
export, ``ng_model_gym.core.export.model_export._export_module_to_vgf`` called as installed,
with its export seconds and its program's PSNR against the float model (the ``.pte`` of the
program it lowers, run by etkit's runner), or "fails: <reason>". The gym exports VGF only: on
XNNPACK the column says so.

Run on demand (not in CI; each export takes 10-120 s here):
    OMP_NUM_THREADS=1 .venv/bin/python bench/gym_zoo.py [--target xnnpack|vgf] [--size H W]
        [--anchor] [NAME ...]
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _zoo() -> Any:
    spec = importlib.util.spec_from_file_location("gym_models", ROOT / "tests/gym_models.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gym_models"] = module
    spec.loader.exec_module(module)
    return module


def run(name: str, target: str, zoo: Any) -> tuple[str, str, str]:
    """(verified, PSNR vs float, seconds) of one export, or the error in place of the PSNR."""
    from etkit_exporter import export_model

    model, inputs = zoo.GYM_MODELS[name].make()
    start = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            result = export_model(
                model, inputs, artifacts_root=Path(tmp) / name, target=target, verify=True
            )
    except Exception as failure:  # one line: the table goes on
        reason = str(failure).splitlines()[0] if str(failure) else ""
        return "error", f"{type(failure).__name__}: {reason}"[:100], f"{_since(start):.0f}"
    verification = result.verification or {}
    psnr = [
        math.inf if c["psnr_db"] is None else float(c["psnr_db"])
        for c in verification.get("comparisons", [])
        if c["reference"] == "float model"
    ]
    verified = "yes" if verification.get("verdict", {}).get("result") == "pass" else "no"
    worst = f"{min(psnr):.1f} dB" if psnr else "-"
    return verified, worst, f"{_since(start):.0f}"


def gym_flow(model: Any, inputs: tuple[Any, ...], out_dir: Path) -> Any:
    """The gym's own VGF export of ``model`` (int8 PTQ, ``ExportType.PTQ_INT8``), as its
    ``executorch_vgf_export`` runs it past loading a checkpoint and tracing a dataset sample
    (both need the gym's datasets and CUDA): the inputs in channels-last memory, then the gym's
    ``_export_module_to_vgf`` unmodified (``torch.export`` strict, ``TOSAQuantizer`` with the
    gym's ``get_symmetric_quantization_config(is_qat=False)``, ``prepare_pt2e``, calibration on
    the inputs and, as with any static-shape config, on ``torch.rand`` inputs of those shapes,
    ``convert_pt2e``, a first ``to_edge_transform_and_lower`` for the I/O scales' metadata file,
    the final one with the ``VgfPartitioner`` dumping the VGF into ``out_dir``). The config is
    the gym's static-shape one (``dynamic_shape: false``, ``vgf_static_input_shape`` = the
    inputs' shapes): model-converter 0.11 has no dynamic dimensions. Returns the final
    ``EdgeProgramManager`` (the gym discards it; a wrapper of the gym module's
    ``to_edge_transform_and_lower`` keeps it)."""
    import torch
    from ng_model_gym.core.export import model_export
    from ng_model_gym.core.model.base_ng_model import BaseNGModel
    from ng_model_gym.core.utils.enum_definitions import ExportType

    from etkit_exporter.vgf.tools import configure_model_converter

    class Wrapped(BaseNGModel):  # what get_neural_network returns: the network exported
        def __init__(self, params: Any, network: torch.nn.Module) -> None:
            super().__init__(params)
            self.neural_network = network

        def get_neural_network(self) -> torch.nn.Module:
            return self.neural_network

        def set_neural_network(self, neural_network: torch.nn.Module) -> None:
            self.neural_network = neural_network

        def forward(self, *args: Any) -> Any:
            return self.neural_network(*args)

    configure_model_converter()  # the venv's model-converter when the venv is not activated
    export = types.SimpleNamespace(
        dynamic_shape=False,
        vgf_static_input_shape=[tuple(t.shape) for t in inputs],
        vgf_output_dir=str(out_dir),
    )
    params = types.SimpleNamespace(output=types.SimpleNamespace(export=export))
    forward_input = tuple(
        t.to(memory_format=torch.channels_last) if t.ndim == 4 else t for t in inputs
    )
    lowered: list[Any] = []
    real = model_export.to_edge_transform_and_lower

    def keep(*args: Any, **kwargs: Any) -> Any:
        lowered.append(real(*args, **kwargs))
        return lowered[-1]

    model_export.to_edge_transform_and_lower = keep
    try:
        with torch.random.fork_rng():  # the static-shape pass's torch.rand, seeded
            torch.manual_seed(0)
            model_export._export_module_to_vgf(
                params,
                Wrapped(params, model),
                forward_input,
                ExportType.PTQ_INT8,
                out_dir / "metadata.json",
            )
    finally:
        model_export.to_edge_transform_and_lower = real
    return lowered[-1]


def anchor(name: str, target: str, zoo: Any) -> tuple[str, str]:
    """(the gym flow's PSNR vs float or "fails: <reason>", its export seconds)."""
    import torch

    from etkit_exporter.check.metrics import psnr
    from etkit_exporter.programs import load_program

    if target != "vgf":
        return "n/a: the gym exports VGF only", "-"
    model, inputs = zoo.GYM_MODELS[name].make()
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        try:
            manager = gym_flow(model, inputs, Path(tmp))
        except Exception as failure:
            return _fails(failure), f"{_since(start):.0f}"
        seconds = f"{_since(start):.0f}"
        try:
            pte = Path(tmp) / "gym.pte"
            pte.write_bytes(manager.to_executorch().buffer)
            forward_input = [t.to(memory_format=torch.channels_last) for t in inputs]
            outputs = load_program(pte).run(forward_input).outputs
        except Exception as failure:
            return f"lowers; run {_fails(failure)}", seconds
    with torch.no_grad():
        reference = model(*inputs)
    references = reference if isinstance(reference, (tuple, list)) else (reference,)
    scores = [
        psnr(out.float().contiguous(), ref) for out, ref in zip(outputs, references, strict=True)
    ]
    worst = min(math.inf if s is None else s for s in scores)
    return f"{worst:.1f} dB", seconds


def _fails(failure: BaseException) -> str:
    """The root of the chain of errors as ``fails: <type>: <line>``."""
    while (failure.__cause__ or failure.__context__) is not None:
        failure = failure.__cause__ or failure.__context__  # type: ignore[assignment]
    reason = str(failure).splitlines()[0] if str(failure) else ""
    return f"fails: {type(failure).__name__}: {reason}"[:160]


def _since(start: float) -> float:
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", choices=("xnnpack", "vgf"), action="append")
    parser.add_argument("--size", type=int, nargs=2, metavar=("H", "W"))
    parser.add_argument(
        "--anchor", action="store_true", help="also run the gym's own export flow (VGF)"
    )
    parser.add_argument("names", nargs="*")
    args = parser.parse_args()
    zoo = _zoo()
    if not zoo.gym_installed():
        sys.exit("ng-model-gym is not installed (scripts/setup.sh installs it)")
    if args.size:
        zoo.SIZE = tuple(args.size)
    names = args.names or list(zoo.GYM_MODELS)
    unknown = sorted(set(names) - set(zoo.GYM_MODELS))
    if unknown:
        sys.exit(f"unknown networks: {', '.join(unknown)} (known: {', '.join(zoo.GYM_MODELS)})")
    header = "| network | target | verified | PSNR vs float | export s |"
    rule = "|---|---|---|---|---|"
    if args.anchor:
        header += " gym's flow: PSNR vs float | gym's flow: export s |"
        rule += "---|---|"
    print(header)
    print(rule)
    for name in names:
        for target in args.target or zoo.TARGETS:
            verified, psnr, seconds = run(name, target, zoo)
            row = f"| {name} | {target} | {verified} | {psnr} | {seconds} |"
            if args.anchor:
                gym_psnr, gym_seconds = anchor(name, target, zoo)
                row += f" {gym_psnr} | {gym_seconds} |"
            print(row, flush=True)


if __name__ == "__main__":
    main()
