"""``etkit-export --config FILE``: every command-line option in a TOML file, and the
``export.toml`` each export writes so that ``etkit-export --config artifacts/x/export.toml``
exports the same program again.

The keys are the long option names (``quant-input``, ``target``, ...; ``quant_input`` is
accepted too); a repeatable option takes a list, a flag a boolean, a demo ``demo = "stn"``.
Options given on the command line override the file."""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

# What each key holds: "str", "list" (a repeatable option) or "bool" (a flag). ``force`` is
# left out on purpose: replacing files is asked for on the command line, never by a file.
OPTIONS: Final[dict[str, str]] = {
    "demo": "str",
    "model": "str",
    "inputs": "str",
    "input_shape": "list",
    "quant_input": "list",
    "quant_output": "list",
    "quant_grid": "str",
    "quant_sampler_image": "str",
    "quant_sampler_output": "str",
    "calibration": "str",
    "image_range": "str",
    "no_quant": "bool",
    "target": "str",
    "tosa_spec": "str",
    "grid_math": "str",
    "out": "str",
    "intermediates": "str",
    "verify": "bool",
    "verify_tolerance": "str",
    "bundle": "bool",
    "scenario": "bool",
    "sampler_delegate": "bool",
    "sizes": "str",
    "dynamic_size": "str",
    "qat_checkpoint": "str",
    "etrecord": "str",
    "state": "list",
    "calibration_sequences": "str",
    "loop_frames": "str",
}

CONFIG_NAME: Final = "export.toml"


class ConfigError(ValueError):
    """A config file that cannot be read, or holds an unknown key or a value of the wrong
    type."""


def _key(name: str) -> str:
    return name.replace("-", "_")


def read_config(path: Path) -> dict[str, Any]:
    """The options in ``path`` keyed by their argparse names (``quant_input``), checked."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"--config {path}: no such file") from None
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"--config {path} cannot be read: {error}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"--config {path} is not valid TOML: {error}") from None
    options: dict[str, Any] = {}
    for name, value in data.items():
        key = _key(name)
        kind = OPTIONS.get(key)
        if kind is None:
            known = ", ".join(k.replace("_", "-") for k in OPTIONS)
            hint = " (force is given on the command line only)" if key == "force" else ""
            raise ConfigError(f"--config {path}: unknown option '{name}'{hint}; known: {known}")
        if kind == "bool" and not isinstance(value, bool):
            raise ConfigError(f"--config {path}: '{name}' must be true or false, got {value!r}")
        if kind == "str" and not isinstance(value, str):
            raise ConfigError(f"--config {path}: '{name}' must be a string, got {value!r}")
        if kind == "list":
            if isinstance(value, str):
                value = [value]
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ConfigError(
                    f"--config {path}: '{name}' must be a list of strings, got {value!r}"
                )
        options[key] = value
    return options


def render_config(options: Mapping[str, Any]) -> str:
    """The TOML text of ``options`` (argparse names; ``None``, ``False`` and empty lists left
    out), keys in ``OPTIONS`` order: the same options give the same bytes."""
    lines = [
        "# etkit-export options of this export: etkit-export --config export.toml exports it",
        "# again (give --force to replace this folder, or -o for another one).",
    ]
    for key, kind in OPTIONS.items():
        value = options.get(key)
        if value is None or value is False or value == []:
            continue
        name = key.replace("_", "-")
        if kind == "bool":
            lines.append(f"{name} = true")
        elif kind == "list":
            lines.append(f"{name} = [{', '.join(json.dumps(str(v)) for v in value)}]")
        else:
            lines.append(f"{name} = {json.dumps(str(value))}")
    return "\n".join(lines) + "\n"
