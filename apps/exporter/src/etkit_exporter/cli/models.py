"""``etkit-export``'s models and example inputs: a factory from a module or a ``.py`` file, an
exported ``.pt2``, inputs from ``.pt``/``.npz`` files or random at given shapes; and the two
errors a command line's model can give (``UsageError``, ``ModelError``)."""

from __future__ import annotations

import importlib
import importlib.util
import math
import os
import sys
from pathlib import Path
from typing import Any

import torch

from etkit_exporter.core.diagnostics import root_cause


class UsageError(Exception):
    """A mistake in the command line."""


class ModelError(Exception):
    """The user's model could not be built (its factory raised)."""


def load_model(
    spec: str, shapes: list[tuple[int, ...]], inputs: tuple[torch.Tensor, ...] | None = None
) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """The model ``spec`` names and its example inputs: ``module:factory`` or
    ``file.py:factory`` (the factory returns the module, or the module and its example inputs),
    ``file.py`` (defining ``ModelUnderTest`` and ``ModelInputs``, the convention of ExecuTorch's
    Arm compiler) or ``file.pt2`` (``torch.export.save``: its module and example inputs).
    ``inputs`` (from ``--inputs``), or random example inputs in [-1, 1] made from ``shapes``,
    replace the model's own."""
    for shape in shapes:
        _check_fits_in_memory(shape)
    given = _Given(shapes, inputs)
    if spec.endswith(".pt2"):
        return _load_pt2(Path(spec), given)
    path_spec, _, attribute = spec.partition(":") if ".py:" in spec else (spec, "", "")
    if path_spec.endswith(".py"):
        module = _import_file(Path(path_spec))
        if not attribute:
            return _module_under_test(module, path_spec, given)
        return _call_factory(module, path_spec, attribute, spec, given)
    if ":" not in spec:
        raise UsageError(
            f"--model '{spec}' must be package.module:factory, file.py[:factory] or file.pt2"
        )
    module_name, factory_name = spec.split(":", 1)
    searched = _search_first(Path.cwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise UsageError(
            f"cannot import --model module '{module_name}': {error} (looked in {searched} and "
            "the installed packages); run from the folder that holds it or add that folder "
            "to PYTHONPATH"
        ) from error
    except Exception as error:
        raise UsageError(
            f"importing --model module '{module_name}' raised {root_cause(error)}; fix the module"
        ) from error
    return _call_factory(module, module_name, factory_name, spec, given)


class _Given:
    """Example inputs given on the command line (``--inputs``, ``--input-shape``), if any."""

    def __init__(self, shapes: list[tuple[int, ...]], inputs: tuple[torch.Tensor, ...] | None):
        self.shapes, self.inputs = shapes, inputs

    def __bool__(self) -> bool:
        return bool(self.shapes) or self.inputs is not None

    def make(self) -> tuple[torch.Tensor, ...]:
        """Made after the model (whose construction may draw random numbers)."""
        return self.inputs if self.inputs is not None else _random_inputs(self.shapes)


def _search_first(*folders: Path) -> str:
    """Puts ``folders`` first on ``sys.path``, as Python does for a program it runs (``python -m``
    the working folder, ``python FILE.py`` the file's folder; ExecuTorch's Arm compiler runs
    with ``-m``), so that a model imports the modules beside it. Returns where it looked, for
    an error message."""
    for folder in reversed(folders):
        entry = str(folder.resolve())
        if entry in sys.path:
            sys.path.remove(entry)
        sys.path.insert(0, entry)
    places = [f"the working folder {Path.cwd()}" if f == Path.cwd() else str(f) for f in folders]
    return ", ".join(dict.fromkeys(places))


def _import_file(path: Path) -> Any:
    if not path.is_file():
        raise UsageError(f"--model file {path} does not exist")
    searched = _search_first(path.resolve().parent, Path.cwd())
    name = f"_etkit_user_model_{abs(hash(str(path.resolve())))}"
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or module_spec.loader is None:
        raise UsageError(f"--model file {path} cannot be imported as Python")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except Exception as error:
        del sys.modules[name]
        if isinstance(error, ModuleNotFoundError):
            raise UsageError(
                f"running --model file {path} raised {root_cause(error)} (looked in {searched} "
                f"and the installed packages); put that module beside {path.name} or add its "
                "folder to PYTHONPATH"
            ) from error
        raise UsageError(
            f"running --model file {path} raised {root_cause(error)}; fix the file"
        ) from error
    return module


def _module_under_test(
    module: Any, path: str, given: _Given
) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    model = getattr(module, "ModelUnderTest", None)
    if not isinstance(model, torch.nn.Module):
        raise UsageError(
            f"--model file {path} defines no ModelUnderTest module: define ModelUnderTest "
            "(a torch.nn.Module instance) and ModelInputs, or name a factory as "
            f"{path}:FACTORY"
        )
    if given:
        return model, given.make()
    inputs = getattr(module, "ModelInputs", None)
    if inputs is None:
        raise UsageError(f"--model file {path} defines no ModelInputs: define it or give --inputs")
    return model, inputs if isinstance(inputs, tuple) else tuple(inputs) if isinstance(
        inputs, list
    ) else (inputs,)


def _load_pt2(path: Path, given: _Given) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    if not path.is_file():
        raise UsageError(f"--model file {path} does not exist")
    try:
        program = torch.export.load(path)
    except Exception as error:
        raise UsageError(
            f"--model {path} is not a program written by torch.export.save ({root_cause(error)})"
        ) from error
    module = program.module()
    # The program's train/eval mode was fixed when it was exported; its module refuses
    # .train()/.eval(), which every export calls: give it back the plain Module methods.
    for name in ("train", "eval"):
        module.__dict__.pop(name, None)
    if given:
        return module, given.make()
    example = program.example_inputs
    if example is None or example[1]:
        raise UsageError(
            f"--model {path} holds no positional example inputs: give --inputs or --input-shape"
        )
    return module, tuple(example[0])


def _random_inputs(shapes: list[tuple[int, ...]]) -> tuple[torch.Tensor, ...]:
    torch.manual_seed(0)
    return tuple(torch.rand(shape) * 2 - 1 for shape in shapes)


def load_inputs(path: Path) -> tuple[torch.Tensor, ...]:
    """Example inputs from ``path``: a ``.pt`` holding a tensor or a tuple/list of tensors, or a
    ``.npz`` (arrays in the order saved)."""
    if not path.is_file():
        raise UsageError(f"--inputs {path} does not exist")
    try:
        if path.suffix == ".npz":
            import numpy as np

            with np.load(path, allow_pickle=False) as data:
                values: Any = [torch.from_numpy(data[name].copy()) for name in data.files]
        elif path.suffix == ".pt":
            values = torch.load(path, map_location="cpu", weights_only=True)
        else:
            raise UsageError(f"--inputs {path}: give a .pt or .npz file")
    except UsageError:
        raise
    except Exception as error:
        raise UsageError(f"--inputs {path} cannot be read: {root_cause(error)}") from error
    values = values if isinstance(values, list | tuple) else [values]
    if not values or not all(isinstance(v, torch.Tensor) for v in values):
        kinds = ", ".join(type(v).__name__ for v in values) or "nothing"
        raise UsageError(f"--inputs {path} must hold tensors (one per model input), got {kinds}")
    return tuple(v if v.dtype != torch.float64 else v.float() for v in values)


def _call_factory(
    module: Any, where: str, factory_name: str, spec: str, given: _Given
) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    factory = getattr(module, factory_name, None)
    if factory is None:
        raise UsageError(f"--model module '{where}' has no '{factory_name}'")
    if not callable(factory):
        raise UsageError(
            f"--model '{spec}' is a {type(factory).__name__}, not a callable factory that returns "
            "the model (or the model and its example inputs)"
        )
    try:
        made = factory()
    except Exception as error:
        raise ModelError(f"--model factory '{spec}' raised {root_cause(error)}") from error
    if isinstance(made, tuple) and len(made) == 2 and isinstance(made[0], torch.nn.Module):
        model, inputs = made
        inputs = tuple(inputs) if isinstance(inputs, list | tuple) else (inputs,)
        return model, given.make() if given else inputs
    if not isinstance(made, torch.nn.Module):
        raise UsageError(f"--model factory returned {type(made).__name__}, not a torch.nn.Module")
    if not given:
        raise UsageError(
            "--model factory returned only the module: give --inputs FILE or --input-shape per "
            "input"
        )
    return made, given.make()


def _check_fits_in_memory(shape: tuple[int, ...]) -> None:
    """Refuses an ``--input-shape`` whose float32 tensor alone exceeds this machine's memory."""
    needed = 4 * math.prod(shape)
    try:
        available = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return
    if needed > available:
        text = "x".join(map(str, shape))
        raise UsageError(
            f"--input-shape {text} needs {needed / 2**30:.1f} GiB for one float32 tensor; this "
            f"machine has {available / 2**30:.1f} GiB: give a smaller shape"
        )
