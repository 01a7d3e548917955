"""etkit in Google's Model Explorer (``ai-edge-model-explorer``): an adapter extension that
draws an etkit ``.pte`` with its grid-sampler delegates' parameters (mode, padding mode,
align_corners, image/grid/output quantization and shapes) and every delegate's backend id and
size, and per-node data files from an export's verification (time, error in steps and dB per
delegate call). See apps/exporter/docs/model_explorer.md.

```
pip install 'etkit-exporter[model-explorer]'
model-explorer artifacts/x/model.pte --extensions=etkit_exporter.model_explorer \\
    --node_data_paths=artifacts/x/model_explorer_node_data.json
```

Model Explorer loads ``etkit_exporter.model_explorer.main`` (the adapter, ``EtkitPteAdapter``).
This package itself imports no Model Explorer: ``write_node_data`` (what verification calls)
works without it, and ``convert_pte`` imports it on use."""

from __future__ import annotations

from etkit_exporter.core.backend_ids import GRID_SAMPLER_BACKEND, VGF_BACKEND
from etkit_exporter.model_explorer.attributes import (
    delegate_attributes,
    delegate_call_sites,
    grid_sampler_attributes,
    method_delegate_attributes,
    node_id,
)
from etkit_exporter.model_explorer.graph import BUILDERS, Builder, convert_pte, upstream_available
from etkit_exporter.model_explorer.node_data import (
    DB_FILE,
    MS_FILE,
    NODE_DATA_FILE,
    STEPS_FILE,
    DelegateFigures,
    delegate_figures,
    node_data,
    write_node_data,
)

ADAPTER_ID = "etkit_pte_adapter"

__all__ = [
    "ADAPTER_ID",
    "BUILDERS",
    "DB_FILE",
    "GRID_SAMPLER_BACKEND",
    "MS_FILE",
    "NODE_DATA_FILE",
    "STEPS_FILE",
    "VGF_BACKEND",
    "Builder",
    "DelegateFigures",
    "convert_pte",
    "delegate_attributes",
    "delegate_call_sites",
    "delegate_figures",
    "grid_sampler_attributes",
    "method_delegate_attributes",
    "node_data",
    "node_id",
    "upstream_available",
    "write_node_data",
]
