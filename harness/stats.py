"""The one percentile the tests and benchmarks use."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence

__all__ = ["percentile", "percentiles"]


def percentile(xs: Iterable[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``xs``, linearly interpolated (numpy's default)."""
    s = sorted(xs)
    if not s:
        raise ValueError("percentile of no values")
    k = (len(s) - 1) * q
    f = math.floor(k)
    c = min(f + 1, len(s) - 1)
    return s[f] + (s[c] - s[f]) * (k - f)


def percentiles(
    xs: Iterable[float], pcts: Sequence[float] = (50, 95, 99), scale: float = 1.0
) -> dict[str, float | None]:
    """n, each percentile (``p50``, ``p99.9``...), max and mean of ``xs``, times ``scale``."""
    s = sorted(xs)
    out: dict[str, float | None] = {"n": len(s)}
    for p in pcts:
        out[f"p{p:g}"] = percentile(s, p / 100) * scale if s else None
    out["max"] = s[-1] * scale if s else None
    out["mean"] = statistics.fmean(s) * scale if s else None
    return out
