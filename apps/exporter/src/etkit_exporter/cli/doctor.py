"""``etkit doctor``: is every part of the toolchain present and working on this machine?

One check per component; each says what it found, or what is wrong and how to fix it.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final, TextIO

from etkit_exporter.vgf.tools import ToolNotFoundError, find_tool
from etkit_exporter.vgf.vulkan_env import GRAPH_LAYER, TENSOR_LAYER, ml_emulation_env

# Each check imports what it checks (torch, ExecuTorch's Arm backend, the Vulkan kernel, the
# runtime) inside its function: `etkit` imports this module for every command, and a check that
# finds a part missing reports it instead of failing at import.

SETUP_FIX: Final = "run scripts/setup.sh"


class CheckFailedError(Exception):
    """A check found something wrong; the message says what, ``fix`` what to do."""

    def __init__(self, message: str, fix: str = SETUP_FIX) -> None:
        super().__init__(message)
        self.fix = fix


@dataclass(frozen=True)
class CheckResult:
    """The outcome of one check."""

    component: str
    ok: bool
    detail: str
    fix: str = ""
    seconds: float = 0.0


def _run(args: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, check=False, timeout=120, **kwargs)  # type: ignore[call-overload, no-any-return]


def _expect_version(distribution: str, pattern: str, pin: str) -> str:
    try:
        version = importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        raise CheckFailedError(f"{distribution} is not installed", f"pip install '{pin}'") from None
    if not re.fullmatch(pattern, version):
        raise CheckFailedError(f"{distribution} {version}, expected {pin}", f"pip install '{pin}'")
    return version


def check_python() -> str:
    if sys.version_info[:2] != (3, 11):
        raise CheckFailedError(f"Python {platform.python_version()}", "use Python 3.11")
    return f"{platform.python_version()} ({sys.executable})"


def check_torch() -> str:
    version = _expect_version("torch", r"2\.13\.0(\+cpu)?", "torch==2.13.0")
    import torch

    if torch.version.cuda is not None:
        raise CheckFailedError(f"torch {version} is a CUDA build", "reinstall the CPU build")
    return f"{version} (CPU build)"


def check_executorch() -> str:
    return _expect_version("executorch", r"1\.5\.1", "executorch==1.5.1")


def check_torchao() -> str:
    return _expect_version("torchao", r"0\.18\.\d+.*", "torchao>=0.18,<0.19")


def arm_check(mode: str, name: str, env: dict[str, str] | None = None) -> str:
    """The check ``name`` of ExecuTorch's own VGF preflight
    (``executorch.backends.arm.vgf.check_env``, report ``mode``: "aot" or "host-emulator"),
    run with ``env`` as the process environment when given (etkit sets the ML emulation layers
    per process, not in the user's shell); its detail when it passes or warns, else
    ``CheckFailedError`` with its action as the fix."""
    from executorch.backends.arm.vgf import check_env

    reports = {
        "aot": check_env.check_vgf_aot_environment,
        "host-emulator": check_env.check_vgf_host_emulator_environment,
    }
    saved = dict(os.environ)
    try:
        if env is not None:
            os.environ.clear()
            os.environ.update(env)
        report = reports[mode]()
    finally:
        if env is not None:
            os.environ.clear()
            os.environ.update(saved)
    for check in report.checks:
        if check.name == name:
            if not check.ok:
                raise CheckFailedError(f"{name}: {check.detail}", check.action or SETUP_FIX)
            return _first_line(check.detail)
    raise CheckFailedError(f"ExecuTorch's check_env ({mode}) has no check named {name!r}")


def check_tosa_serializer() -> str:
    version = _expect_version("tosa-tools", r"2026\.5\.0", "tosa-tools==2026.5.0")
    found = arm_check("aot", "TOSA serializer")
    return f"tosa-tools {version}; check_env: {found}"


def check_model_converter() -> str:
    from etkit_exporter.vgf.tools import configure_model_converter

    try:
        path = configure_model_converter()  # as an export does, when the venv is not active
    except ToolNotFoundError as error:
        raise CheckFailedError(
            str(error), "pip install ai-ml-sdk-model-converter==0.11.0"
        ) from None
    arm_check("aot", "MLSDK model converter")  # found by the Arm backend, answers --version
    done = _run([path, "--version"])
    if done.returncode != 0:
        raise CheckFailedError(
            f"{path} --version failed: {(done.stderr or done.stdout).strip()[-300:]}",
            "pip install ai-ml-sdk-model-converter==0.11.0 (0.10.0 needs glibc 2.38)",
        )
    try:
        version = json.loads(done.stdout)["version"]
    except (ValueError, KeyError, TypeError):
        version = _first_line(done.stdout)
    return f"{version} ({path})"


def _first_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0] if lines else ""


def check_vulkan_device() -> str:
    from etkit_gridsampler.vulkan import VulkanUnavailableError, device_info

    try:
        info = device_info()
    except VulkanUnavailableError as error:
        raise CheckFailedError(
            str(error), "apt-get install libvulkan1 mesa-vulkan-drivers"
        ) from None
    driver = f"{info.driver_name} {info.driver_info}".strip() or str(info.driver_version)
    return f"{info.name} ({info.device_type}), Vulkan {info.api_version}, driver {driver}"


def check_emulation_layers() -> str:
    try:
        vulkaninfo = find_tool("vulkaninfo")
    except ToolNotFoundError as error:
        raise CheckFailedError(str(error), "apt-get install vulkan-tools") from None
    env = ml_emulation_env()
    arm_check("host-emulator", "VKML emulation layer", env)  # layers set and found
    done = _run([vulkaninfo], env=env)
    if done.returncode != 0:
        raise CheckFailedError(f"vulkaninfo failed: {done.stderr.strip()[-300:]}")
    layers = re.findall(r"^(VK_LAYER_\S+) \(", done.stdout, flags=re.MULTILINE)
    if GRAPH_LAYER not in layers or TENSOR_LAYER not in layers:
        raise CheckFailedError(
            f"the loader found layers {layers}, not both ML emulation layers",
            "pip install ai-ml-emulation-layer-for-vulkan==0.11.0",
        )
    if layers.index(GRAPH_LAYER) > layers.index(TENSOR_LAYER):
        raise CheckFailedError(
            "the Tensor layer loads above the Graph layer", "report a bug in etkit's vulkan_env"
        )
    missing = [e for e in ("VK_ARM_tensors", "VK_ARM_data_graph") if e not in done.stdout]
    if missing:
        raise CheckFailedError(f"the device lacks {missing} with the layers loaded")
    return f"{GRAPH_LAYER} above {TENSOR_LAYER}; VK_ARM_tensors and VK_ARM_data_graph present"


_TRIVIAL_SHADER: Final = """#version 450
layout(local_size_x = 1) in;
layout(set = 0, binding = 0) buffer Data { int values[]; } data;
void main() { data.values[gl_GlobalInvocationID.x] += 1; }
"""


def check_glslc() -> str:
    from etkit_gridsampler.vulkan import compile_glsl, find_glsl_compiler

    compilers = []
    try:
        import scenario_runner

        glslc = Path(scenario_runner.__path__[0]) / "binaries" / "bin" / "glslc"
    except ImportError:
        raise CheckFailedError("the scenario-runner wheel (its glslc) is missing") from None
    with tempfile.TemporaryDirectory(prefix="etkit-doctor-") as tmp:
        src, spv = Path(tmp) / "t.comp", Path(tmp) / "t.spv"
        src.write_text(_TRIVIAL_SHADER)
        done = _run([str(glslc), "--input", str(src), "--output", str(spv)])
        if done.returncode != 0 or not spv.is_file():
            raise CheckFailedError(f"{glslc} failed: {(done.stderr or done.stdout)[-300:]}")
        compilers.append(f"glslc ({glslc})")
    try:
        spirv = compile_glsl(_TRIVIAL_SHADER)
    except (FileNotFoundError, RuntimeError) as error:
        raise CheckFailedError(str(error), "apt-get install glslang-tools") from None
    compilers.append(f"{Path(find_glsl_compiler()[0]).name} ({len(spirv)} bytes of SPIR-V)")
    return "; ".join(compilers)


def check_scenario_runner() -> str:
    """Lowers a one-layer model to VGF with model-converter and runs it with scenario_runner."""
    import numpy as np
    import torch
    from executorch.backends.arm.vgf import VgfCompileSpec, VgfPartitioner
    from executorch.exir import to_edge_transform_and_lower

    from etkit_exporter.vgf.scenario import ScenarioError, run_vgf, vgf_delegates
    from etkit_exporter.vgf.tools import configure_model_converter

    configure_model_converter()
    torch.manual_seed(0)
    model = torch.nn.Conv2d(2, 3, 1).eval()
    example = torch.randn(1, 2, 4, 4)
    exported = torch.export.export(model, (example,), strict=True)
    lowered = to_edge_transform_and_lower(exported, partitioner=[VgfPartitioner(VgfCompileSpec())])
    blobs = vgf_delegates(lowered.exported_program())
    if len(blobs) != 1:
        raise CheckFailedError(f"lowering gave {len(blobs)} VGF delegates, expected 1")
    try:
        (output,) = run_vgf(blobs[0], [example.numpy()])
    except ScenarioError as error:
        raise CheckFailedError(str(error)) from None
    error_max = float(np.abs(output - model(example).detach().numpy()).max())
    if error_max > 1e-5:
        raise CheckFailedError(f"a VGF conv differs from PyTorch by {error_max:.3g}")
    runner = find_tool("scenario_runner")
    return f"{runner}: a VGF conv matches PyTorch (max abs error {error_max:.1e})"


_BACKEND_TU: Final = """#include <executorch/runtime/backend/interface.h>
using executorch::runtime::register_backend;
int main() { return 0; }
"""


def check_cxx_toolchain() -> str:
    compiler = shutil.which(os.environ.get("CXX", "c++"))
    cmake = shutil.which("cmake")
    if compiler is None or cmake is None:
        raise CheckFailedError("no C++ compiler or cmake on PATH", "apt-get install g++ cmake")
    import executorch

    root = Path(executorch.__path__[0])
    library = root / "lib" / "libexecutorch.so"
    include = root / "include"
    if not library.is_file() or not include.is_dir():
        raise CheckFailedError(f"the executorch wheel at {root} lacks its headers or library")
    with tempfile.TemporaryDirectory(prefix="etkit-doctor-") as tmp:
        source = Path(tmp) / "backend.cpp"
        source.write_text(_BACKEND_TU)
        done = _run(
            [
                compiler,
                "-std=c++17",
                "-DC10_USING_CUSTOM_GENERATED_MACROS",
                "-DET_EVENT_TRACER_ENABLED",
                f"-I{include}",
                f"-I{include}/executorch/runtime/core/portable_type/c10",
                str(source),
                str(library),
                f"-Wl,-rpath,{library.parent}",
                "-o",
                str(Path(tmp) / "a.out"),
            ]
        )
        if done.returncode != 0:
            raise CheckFailedError(
                f"compiling against the executorch headers failed: {done.stderr[-400:]}"
            )
    from etkit_gridsampler import runtime

    try:
        backend = runtime.register()
    except (RuntimeError, OSError) as error:
        raise CheckFailedError(f"etkit-gridsampler's backend does not load: {error}") from None
    version = _first_line(_run([compiler, "--version"]).stdout)
    return f"{version}; builds and links against {library}; {backend} registered"


CHECKS: Final[list[tuple[str, Callable[[], str]]]] = [
    ("python", check_python),
    ("torch", check_torch),
    ("executorch", check_executorch),
    ("torchao", check_torchao),
    ("tosa_serializer", check_tosa_serializer),
    ("model-converter", check_model_converter),
    ("vulkan device", check_vulkan_device),
    ("ML emulation layers", check_emulation_layers),
    ("glslc", check_glslc),
    ("scenario_runner", check_scenario_runner),
    ("C++ toolchain", check_cxx_toolchain),
]


def run_checks(only: list[str] | None = None) -> list[CheckResult]:
    """Runs the checks (all, or those named in ``only``) and returns one result each."""
    results = []
    for component, check in CHECKS:
        if only is not None and component not in only:
            continue
        start = time.perf_counter()
        try:
            detail = check()
            results.append(
                CheckResult(component, True, detail, seconds=time.perf_counter() - start)
            )
        except CheckFailedError as error:
            results.append(
                CheckResult(component, False, str(error), error.fix, time.perf_counter() - start)
            )
        except Exception as error:  # a check must report, never crash the doctor
            results.append(
                CheckResult(
                    component,
                    False,
                    f"{type(error).__name__}: {error}",
                    SETUP_FIX,
                    time.perf_counter() - start,
                )
            )
    return results


def print_results(results: list[CheckResult], stream: TextIO) -> None:
    """One line per component: status, name, what was found (and the fix when it failed)."""
    width = max(len(r.component) for r in results)
    for result in results:
        status = "ok  " if result.ok else "FAIL"
        line = f"[{status}] {result.component:<{width}}  {result.detail}"
        if not result.ok:
            line += f"  -> fix: {result.fix}"
        print(line, file=stream)
    failed = sum(not r.ok for r in results)
    total = sum(r.seconds for r in results)
    summary = "all working" if not failed else f"{failed} of {len(results)} not working"
    print(f"etkit doctor: {summary} ({total:.1f} s)", file=stream)
