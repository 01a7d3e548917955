"""How a verification judges: the ``VerifyTolerance`` (its fields and its text form, as
``--verify-tolerance`` and ``export.toml``'s ``verify_tolerance`` give it), parsed once, where a
caller hands it in (``check_tolerance``); everything below takes the parsed value."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Final

from etkit_exporter.check.envelope import MAX_SAMPLES, MIN_SAMPLES


@dataclass(frozen=True)
class VerifyTolerance:
    """How the verdict judges (``check.judgement``; docs/explanation/verdict.md). Give it as
    ``export_model(verify_tolerance=...)``, or as text (``parse_tolerance``:
    ``"samples=16,band=0.02,max-steps=1"``) to ``--verify-tolerance`` and ``verify_tolerance``
    in ``export.toml``.

    - ``samples``: dithered runs of the rounding envelope (4 to 64);
    - ``band``: how near its rounding boundary (in steps) a quantize may round the other way;
    - ``coordinate_bias_px``: the largest systematic shift of a sampling position (pixels);
    - ``float_min_psnr_db``: a float export's floor against the float model;
    - ``max_steps``: when set, no output value further than this many steps (off by default).
    """

    samples: int = 16
    band: float = 0.02
    coordinate_bias_px: float = 0.125
    float_min_psnr_db: float = 60.0
    max_steps: int | None = None

    def __post_init__(self) -> None:
        for item in fields(self):
            value = getattr(self, item.name)
            if value is None and item.name == "max_steps":
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"VerifyTolerance.{item.name} must be a number, got {value!r}")
            if not math.isfinite(value) or value < 0:
                raise ValueError(
                    f"VerifyTolerance.{item.name} must be a finite number >= 0, got {value!r}"
                )
        for name in ("samples", "max_steps"):
            value = getattr(self, name)
            if value is not None and int(value) != value:
                raise ValueError(f"VerifyTolerance.{name} must be a whole number, got {value!r}")
        if not MIN_SAMPLES <= self.samples <= MAX_SAMPLES:
            raise ValueError(
                f"VerifyTolerance.samples must be in [{MIN_SAMPLES}, {MAX_SAMPLES}], got "
                f"{self.samples!r}"
            )
        if self.band > 0.5:
            raise ValueError(
                f"VerifyTolerance.band is at most 0.5 steps (either neighbour), got {self.band!r}"
            )

    def as_dict(self) -> dict[str, float | None]:
        return {k: None if v is None else float(v) for k, v in asdict(self).items()}

    def text(self) -> str:
        """The tolerance as ``parse_tolerance`` reads it."""
        values = self.as_dict()
        return ",".join(
            f"{key}={'off' if values[name] is None else format(values[name], 'g')}"
            for key, name in TOLERANCE_KEYS.items()
        )


# The keys of the text form and the fields they set
TOLERANCE_KEYS: Final = {
    "samples": "samples",
    "band": "band",
    "coordinate-bias": "coordinate_bias_px",
    "float-psnr": "float_min_psnr_db",
    "max-steps": "max_steps",
}
# Keys of the verdict before the rounding envelope (etkit-exporter 0.1): refused with a reason
_RETIRED_KEYS: Final = ("psnr", "steps", "fraction", "bias", "float-error", "float-margin")


def parse_tolerance(text: str) -> VerifyTolerance:
    """A ``VerifyTolerance`` from ``key=value`` pairs separated by commas (keys: samples, band,
    coordinate-bias, float-psnr, max-steps, which also takes ``off``; each one left out keeps
    its default); ``ValueError`` naming the wrong pair otherwise."""
    if not isinstance(text, str):
        raise TypeError(f"a verify tolerance is text such as 'max-steps=1', got {text!r}")
    values: dict[str, float | None] = {}
    for pair in (p.strip() for p in text.split(",")):
        if not pair:
            continue
        key, sep, number = (s.strip() for s in pair.partition("="))
        key = key.replace("_", "-")
        if key in _RETIRED_KEYS:
            raise ValueError(
                f"verify tolerance {text!r}: {key!r} is gone: the verdict judges by the rounding "
                f"envelope now (keys {', '.join(TOLERANCE_KEYS)}; docs/explanation/verdict.md)"
            )
        if not sep or key not in TOLERANCE_KEYS:
            raise ValueError(
                f"verify tolerance {text!r}: {pair!r} is not KEY=NUMBER with KEY one of "
                f"{', '.join(TOLERANCE_KEYS)} (e.g. 'samples=32,max-steps=1')"
            )
        if key == "max-steps" and number == "off":
            values[TOLERANCE_KEYS[key]] = None
            continue
        try:
            values[TOLERANCE_KEYS[key]] = float(number)
        except ValueError:
            raise ValueError(f"verify tolerance {text!r}: {number!r} is not a number") from None
    for name in ("samples", "max_steps"):
        value = values.get(name)
        if value is not None:
            if value != int(value):
                raise ValueError(f"verify tolerance {text!r}: {name} must be a whole number")
            values[name] = int(value)
    try:
        return VerifyTolerance(**values)  # type: ignore[arg-type]
    except (TypeError, ValueError) as error:
        raise ValueError(f"verify tolerance {text!r}: {error}") from None


def check_tolerance(value: object) -> VerifyTolerance:
    """``value`` as a ``VerifyTolerance``: ``None`` (the defaults), one, or its text."""
    if value is None:
        return VerifyTolerance()
    if isinstance(value, VerifyTolerance):
        return value
    if isinstance(value, str):
        return parse_tolerance(value)
    raise TypeError(
        f"verify_tolerance must be a VerifyTolerance or text such as 'max-steps=1', got "
        f"{type(value).__name__}"
    )


DEFAULT_TOLERANCE: Final = VerifyTolerance()
