"""Whether two report.json files say the same: figures equal to FIGURE_TOL, or which entries differ."""

from __future__ import annotations

import math
from pathlib import Path

from common.jsonfile import read_json

# relative: another numpy or scipy sums in another order and moves a float by an ulp or two (2e-16);
# the report prints no figure finer than 1e-4 of itself
FIGURE_TOL = 1e-9


def same_figures(a: object, b: object) -> bool:
    """Equal JSON values, numbers within FIGURE_TOL of each other (1e-12 absolute near zero)."""
    if isinstance(a, float) or isinstance(b, float):
        return (isinstance(a, (int, float)) and isinstance(b, (int, float))
                and math.isclose(a, b, rel_tol=FIGURE_TOL, abs_tol=1e-12))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_figures(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(map(same_figures, a, b))
    return type(a) is type(b) and a == b


def largest_float_change(a: object, b: object) -> float:
    """The largest relative difference between matching numbers of two JSON values of one shape."""
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and a != b:
        return abs(a - b) / max(abs(a), abs(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return max((largest_float_change(a[k], b[k]) for k in a.keys() & b.keys()), default=0.0)
    if isinstance(a, list) and isinstance(b, list):
        return max(map(largest_float_change, a, b), default=0.0)
    return 0.0


def differing_entries(old: dict, new: dict) -> list[str]:
    """The top-level entries of two reports whose figures differ (same_figures), sorted."""
    return [k for k in sorted(set(old) | set(new)) if not same_figures(old.get(k), new.get(k))]


def report_change(before: Path, after: Path) -> str:
    """Whether the report at `after` is identical to the one at `before`, has the same figures, or
    which top-level entries differ."""
    old, new = read_json(before, None, "report"), read_json(after, None, "report")
    keys = differing_entries(old, new)
    if keys:
        return f"differs from {before} in: {', '.join(keys)}"
    if old != new:
        most = largest_float_change(old, new)
        return (f"has the same figures as {before} (some floats differ, by at most {most:.1g} of themselves, "
                f"within {FIGURE_TOL:g}: another numpy or scipy)")
    return f"identical to {before}"
