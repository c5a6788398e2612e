"""Confidence intervals for the rates the package reports (passkey, RULER, accuracies)."""

from __future__ import annotations

import math

__all__ = ["Z95", "intervals_overlap", "rate_fields", "wilson"]

Z95 = 1.959963984540054  # the standard normal's 97.5% quantile: two-sided 95%


def wilson(successes: float, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval of a rate (Wilson 1927, "Probable inference, the law of succession, and
    statistical inference", JASA 22:209-212): the p whose normal test of successes/n does not reject,

        (p + z^2/2n +- z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n),   p = successes/n.

    Unlike the Wald interval p +- z sqrt(p(1-p)/n) it stays inside [0, 1] and is not zero-width at 0/n
    or n/n. `successes` may be fractional (the sum of per-sample scores in [0, 1], as RULER's multi-needle
    tasks give): a mean of [0, 1] scores has variance at most p(1-p)/n, so the interval is then conservative.
    """
    if n <= 0:
        raise ValueError(f"a rate needs n > 0 trials, got n={n}")
    if not 0 <= successes <= n:
        raise ValueError(f"successes must be in [0, n={n}], got {successes}")
    p = successes / n
    z2 = z * z
    centre = p + z2 / (2 * n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    scale = 1 + z2 / n
    low = 0.0 if successes == 0 else (centre - half) / scale  # exact: the formula's ends are 0 and 1 there
    high = 1.0 if successes == n else (centre + half) / scale
    return low, high


def rate_fields(successes: float, n: int) -> dict[str, float | int]:
    """{"n", "low", "high"}: a rate's trial count and 95% Wilson interval, as results cells store them
    next to the rate."""
    low, high = wilson(successes, n)
    return {"n": n, "low": low, "high": high}


def intervals_overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """Whether two intervals share a point: overlapping 95% intervals do not show the rates differ."""
    return a[0] <= b[1] and b[0] <= a[1]
