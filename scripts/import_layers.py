#!/usr/bin/env python3
"""Prints the exporter app's size figures and checks its layering: its folders are layers, every
import runs downward, no import circle, no module over the line limit. The check itself is the
app's test ``apps/exporter/tests/test_layers.py`` (the layer table is there); this runs it on
the package installed in this environment and says what is wrong. Exits 1 on a problem.

    python scripts/import_layers.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "apps" / "exporter" / "tests"))

from test_layers import scan  # the test module, beside the app's tests


def main() -> int:
    figures = scan()
    print(figures.summary())
    for problem in figures.problems:
        print(problem)
    return 1 if figures.problems else 0


if __name__ == "__main__":
    sys.exit(main())
