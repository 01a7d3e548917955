"""Export cost users feel (issue 39, item 5): the ETRecord's bytes against the program's, member
by member, for the default (slim) and the full record; and where the export's time went
(timings.json's ``profile_s``: etkit's own share, the slowest upstream calls of ``lower_main``).

Model: RIFE v4.25's IFNet re-created (bench/fuzz_findings/P-rife-ifnet-v425-64x128.py) at
``--size`` (default 256x448, the issue's). Run on demand (not in CI; about 75 s per export here):

    .venv/bin/python bench/etrecord_bench.py [--target xnnpack|vgf] [--size 256 448]
        [--records slim full] [--json bench-etrecord.json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
IFNET = ROOT / "bench" / "fuzz_findings" / "P-rife-ifnet-v425-64x128.py"

from etkit_exporter import export_model  # noqa: E402
from etkit_exporter.export.pass_profile import profile_text  # noqa: E402


def _ifnet() -> torch.nn.Module:
    spec = importlib.util.spec_from_file_location("ifnet_v425", IFNET)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["ifnet_v425"] = module  # torch.export reads the module's source
    spec.loader.exec_module(module)
    model: torch.nn.Module = module.ModelUnderTest
    return model


def measure(record: str, target: str, size: tuple[int, int], root: Path) -> dict[str, Any]:
    generator = torch.Generator().manual_seed(1)
    inputs = (torch.rand(1, 6, *size, generator=generator) * 2 - 1,)
    start = time.perf_counter()
    result = export_model(_ifnet(), inputs, artifacts_root=root / record, target=target,
                          etrecord=record)  # fmt: skip
    seconds = time.perf_counter() - start
    folder = result.artifacts_root
    pte = (folder / "model.pte").stat().st_size
    path = folder / "etrecord.bin"
    with zipfile.ZipFile(path) as members:
        parts = {i.filename: [i.file_size, i.compress_size] for i in members.infolist()}
    profile = json.loads((folder / "timings.json").read_text())["profile_s"]
    return {
        "record": record,
        "target": target,
        "size": f"{size[0]}x{size[1]}",
        "export_seconds": round(seconds, 1),
        "pte_bytes": pte,
        "etrecord_bytes": path.stat().st_size,
        "ratio": round(path.stat().st_size / pte, 3),
        "members": parts,
        "etrecord_stage_seconds": json.loads((folder / "timings.json").read_text())["timings_s"][
            "etrecord"
        ],
        "profile": profile,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", choices=("xnnpack", "vgf"), default="xnnpack")
    parser.add_argument("--size", type=int, nargs=2, default=(256, 448))
    parser.add_argument("--records", nargs="+", choices=("slim", "full"), default=["slim", "full"])
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="etkit-etrecord-bench-") as scratch:
        for record in args.records:
            row = measure(record, args.target, tuple(args.size), Path(scratch))
            rows.append(row)
            print(f"{record}: model.pte {row['pte_bytes']:,} B, etrecord.bin "
                  f"{row['etrecord_bytes']:,} B ({row['ratio']}x), "
                  f"export {row['export_seconds']} s, "
                  f"etrecord stage {row['etrecord_stage_seconds']} s")  # fmt: skip
            for name, (size, packed) in row["members"].items():
                if size:
                    print(f"    {size:>12,} B -> {packed:>12,} B  {name}")
            print("\n".join(profile_text(row["profile"], limit=8)))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
