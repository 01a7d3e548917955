"""The Model Explorer extension module: Model Explorer imports ``<extension>.main``, so
``model-explorer --extensions=etkit_exporter.model_explorer`` imports this and registers
``EtkitPteAdapter``. Importing it needs ``ai-edge-model-explorer``."""

from __future__ import annotations

import importlib
from typing import Any

from etkit_exporter.model_explorer import ADAPTER_ID
from etkit_exporter.model_explorer.graph import convert_pte

# Model Explorer has no type information: its classes are Any to mypy.
_model_explorer: Any = importlib.import_module("model_explorer")


class EtkitPteAdapter(_model_explorer.Adapter):  # type: ignore[misc]
    """Opens ``.pte`` files: the graph of Arm's ``.pte`` adapter when installed (else etkit's
    drawing of the same instructions), each delegate node with etkit's attributes."""

    metadata = _model_explorer.AdapterMetadata(
        id=ADAPTER_ID,
        name="etkit PTE adapter",
        description=(
            "ExecuTorch .pte files, with the parameters of etkit's grid-sampler delegates "
            "(mode, padding, align_corners, quantization, shapes) on their nodes"
        ),
        source_repo="etkit-exporter",
        fileExts=["pte"],
    )

    def convert(self, model_path: str, settings: dict[str, Any]) -> dict[str, Any]:
        return convert_pte(model_path, settings)
