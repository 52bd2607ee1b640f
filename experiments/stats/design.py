"""How many server instances, windows and window seconds a wanted precision needs, at least GPU time. Pure.

Kalibera and Jones' rule (ISMM 2013): with a variance at each level and a cost of each repetition,
choose the repetitions per level that reach the wanted precision at the least cost. An A/B of I
instance pairs (one server per arm each), W windows of T seconds at L loads, has

    var(mu) = 2 s2_instance / I + s2_cell(T) / (I W L),   s2_cell(T) = s2_cell + (pi / 2) s2_request / (r T),

(r requests per second per cell; the request term is the median's share of one request's scatter)
and costs I (c_start + W c_window(T)) GPU minutes, c_window(T) = arms x L x (overhead + k T) / 60.
With resident sets (--resident) W comes in multiples of the sets (one equal sub-block each), every
window is replayed by its set's arms only (arms: their mean) and the compared pair shares a part of
the windows (`Resident.shared`), so its cell term is over I W L x shared cells.
The interval is the t interval over instance pairs (experiments.stats.instances), I - 1 degrees of
freedom, so a plan has I >= 2. Without the t (normal=True) the two-level optimum is the classic
W* = sqrt(c_start s2_cell / (L c_window 2 s2_instance)) windows per instance pair.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
from scipy import stats as sps

from common.tstats import t_quantile
from experiments.stats.intervals import mde_se
from experiments.stats.paired import pct

MEDIAN_FACTOR2 = math.pi / 2


@dataclass(frozen=True)
class Components:
    """Variances of the paired log ratio (log units squared): one server's instance effect, one cell's
    own noise beyond its requests (or all of it, with request_var 0), and one request's scatter."""

    instance_var: float
    cell_var: float
    request_var: float = 0.0
    requests_per_s: float = 1.0  # paired requests per second of window, per cell

    def cell_at(self, window_s: float) -> float:
        """A cell's variance with windows of window_s seconds."""
        return self.cell_var + MEDIAN_FACTOR2 * self.request_var / (self.requests_per_s * window_s)


@dataclass(frozen=True)
class Costs:
    """GPU minutes: starting one instance pair (both arms' servers); a replay of one cell by one arm
    takes overhead_s + s_per_window_s x window_s seconds."""

    start_min: float
    overhead_s: float
    s_per_window_s: float
    loads: int
    arms: float = 2  # arms replaying each window (with resident sets, the mean over the sets)

    def window_min(self, window_s: float) -> float:
        """GPU minutes of one window: every load, every arm."""
        return self.arms * self.loads * (self.overhead_s + self.s_per_window_s * window_s) / 60.0


@dataclass(frozen=True)
class Resident:
    """Resident sets: windows per instance come in multiples of `sets`, and the compared arms replay
    together in `shared` of them (1: every arm replays every window)."""

    sets: int = 1
    shared: float = 1.0


def variance(c: Components, costs: Costs, instances, windows, window_s, resident: Resident = Resident()):
    """var(mu) of a design (numbers or arrays alike)."""
    cells = instances * windows * resident.shared * costs.loads
    return 2.0 * c.instance_var / instances + c.cell_at(window_s) / cells


def cost(costs: Costs, instances, windows, window_s):
    """GPU minutes of a design: I x (start + W x one window)."""
    return instances * (costs.start_min + windows * costs.window_min(window_s))


def _quantile(instances: np.ndarray, normal: bool, confidence: float) -> np.ndarray:
    p = 0.5 + confidence / 2
    return np.full(instances.shape, sps.norm.ppf(p)) if normal else t_quantile(p, instances - 1)


def _grid(c: Components, costs: Costs, window_s: Sequence[float], max_instances: int, max_windows: int,
          normal: bool, confidence: float, resident: Resident) -> dict:
    windows = np.arange(resident.sets, max_windows + 1, resident.sets)
    i, w, t = np.meshgrid(np.arange(2, max_instances + 1), windows, np.asarray(window_s, dtype=float),
                          indexing="ij")
    var = variance(c, costs, i, w, t, resident)
    return {"instances": i, "windows": w, "window_s": t, "cost": cost(costs, i, w, t),
            "half_width": _quantile(i, normal, confidence) * np.sqrt(var), "se": np.sqrt(var)}


def _chosen(g: dict, k: tuple, target: dict, c: Components, costs: Costs, resident: Resident) -> dict:
    se, dof = float(g["se"][k]), int(g["instances"][k]) - 1
    return {"instances": int(g["instances"][k]), "windows": int(g["windows"][k]),
            "window_s": float(g["window_s"][k]), "loads": costs.loads, "gpu_minutes": float(g["cost"][k]),
            "half_width_pct": pct(float(g["half_width"][k])), "df": dof,
            "mde_pct": pct(mde_se(se, dof)), **target,
            "components": asdict(c), "costs": asdict(costs),
            **({"resident": asdict(resident)} if resident != Resident() else {})}


def design_for_precision(c: Components, costs: Costs, half_width_pct: float,
                         window_s: Sequence[float] = (10.0,), max_instances: int = 64, max_windows: int = 400,
                         normal: bool = False, confidence: float = 0.95,
                         resident: Resident = Resident()) -> dict:
    """The cheapest design whose interval half-width is at most half_width_pct (percent): instances,
    windows, window_s, GPU minutes, the half-width and MDE it gives. ValueError when none in the
    grid reaches it."""
    g = _grid(c, costs, window_s, max_instances, max_windows, normal, confidence, resident)
    ok = g["half_width"] <= math.log1p(half_width_pct / 100.0)
    if not ok.any():
        raise ValueError(f"no design of up to {max_instances} instance pairs x {max_windows} windows "
                         f"reaches +-{half_width_pct:g}%")
    k = np.unravel_index(np.argmin(np.where(ok, g["cost"], np.inf)), ok.shape)
    return _chosen(g, k, {"target_half_width_pct": half_width_pct}, c, costs, resident)


def design_for_budget(c: Components, costs: Costs, gpu_minutes: float, window_s: Sequence[float] = (10.0,),
                    max_instances: int = 64, max_windows: int = 400, normal: bool = False,
                    confidence: float = 0.95, resident: Resident = Resident()) -> dict:
    """The narrowest interval a GPU-minute budget buys (same grid and fields as `plan`)."""
    g = _grid(c, costs, window_s, max_instances, max_windows, normal, confidence, resident)
    ok = g["cost"] <= gpu_minutes
    if not ok.any():
        windows = "one window" if resident.sets == 1 else f"{resident.sets} windows (one per resident set)"
        raise ValueError(f"{gpu_minutes:g} GPU minutes do not buy 2 instance pairs of {windows}")
    k = np.unravel_index(np.argmin(np.where(ok, g["half_width"], np.inf)), ok.shape)
    return _chosen(g, k, {"budget_gpu_minutes": gpu_minutes}, c, costs, resident)
