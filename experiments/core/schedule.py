"""The order in which (window, load) cells are replayed against the arms: pure functions.

Arms are a list; the first is the baseline every other arm is compared with. The arm order of each
cell is randomised and balanced (seeded by the run's seed, recorded per cell in run.json): at every
load the windows cycle through all orderings of the arms, each cycle in a random order, so every
arm takes every position equally often when the windows fill whole cycles, and which arm goes first
is not tied to the window or the load. The position effect that remains is estimated in the
analysis (experiments.stats.paired).

Resident servers (default): every cell is replayed against all arms back to back.

Resident sets (--resident K, fewer servers on the GPU than arms): the arms come in sets of at most K
labels (`cover`), and every instance block of windows is cut into equal sub-blocks, one per set in
the sets' order; a sub-block's cells are replayed only by its set's arms, in balanced random orders of
those arms (per load and set), so a cell's order holds only the arms that replay it.

One server at a time (--one-at-a-time): windows are split into contiguous blocks; in each block the
arms take turns (in that block's random balanced order) replaying all of the block's cells, each on
a freshly started server.

After every server start the runner replays one burn-in cell (phase "burnin", at the highest load the
first window the fresh arms replay together: window 0 unless they are a later resident set's, with
prompts of its own) that is recorded and shown but not compared.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np


@dataclass
class Step:
    """One (window, load) cell, the arm order it is replayed in, and the arms done so far."""

    window: int
    load: float
    load_index: int
    order: tuple[str, ...]
    block: int | None = None
    done: list[str] = field(default_factory=list)
    resident_set: int | None = None  # the index of the resident set that replays it (--resident)

    def to_json(self) -> dict:
        d = {"window": self.window, "load": self.load, "order": list(self.order), "done": list(self.done)}
        if self.block is not None:
            d["block"] = self.block
        if self.resident_set is not None:
            d["set"] = self.resident_set
        return d


@dataclass(frozen=True)
class Segment:
    """A stretch of the run during which the same servers are up: `arms` resident, `steps` replayed, in
    block `block` of windows (a server instance)."""

    arms: tuple[str, ...]
    steps: tuple[Step, ...]
    block: int = 0


def split_blocks(n_windows: int, blocks: int) -> list[range]:
    """Contiguous, near-equal blocks of window ids (the first ones one longer when uneven)."""
    if not 1 <= blocks <= n_windows:
        raise ValueError(f"blocks must be in [1, {n_windows}], got {blocks}")
    size, extra = divmod(n_windows, blocks)
    out, start = [], 0
    for b in range(blocks):
        end = start + size + (b < extra)
        out.append(range(start, end))
        start = end
    return out


def balanced_orders(labels: tuple[str, ...], n: int, rng: np.random.Generator) -> list[tuple[str, ...]]:
    """n arm orders: consecutive cycles through every permutation of labels, each cycle shuffled."""
    perms = list(itertools.permutations(labels))
    out: list[tuple[str, ...]] = []
    while len(out) < n:
        out += [perms[i] for i in rng.permutation(len(perms))]
    return out[:n]


def _consecutive(seq: Sequence[tuple[str, ...]], label: str) -> bool:
    where = [i for i, s in enumerate(seq) if label in s]
    return bool(where) and where[-1] - where[0] == len(where) - 1


def cover(labels: Sequence[str], pairs: Iterable[tuple[str, str]], most: int) -> tuple[tuple[str, ...], ...]:
    """The resident sets of a run whose servers may be at most `most` at once: sets of 2 to `most`
    labels (in label order) that together hold every label and put both labels of every pair of
    `pairs` in one set, the first set holding labels[0] (the baseline) and each label's sets
    consecutive (so that each arm starts once per instance). The fewest sets, then the most pairs of
    labels resident together, then the earliest labels first; all labels as one set when `most` allows.
    ValueError when no such order exists."""
    labels = tuple(labels)
    if most >= len(labels):
        return (labels,)
    need = list(dict.fromkeys(frozenset(p) for p in pairs))  # in the order given, each once
    if most < 2:
        raise ValueError(f"a resident set holds 2 or more servers, got {most}")
    index = {lab: i for i, lab in enumerate(labels)}
    candidates = [c for k in range(2, most + 1) for c in itertools.combinations(labels, k)]
    for m in range(1, len(need) + 1):
        best = None
        for seq in itertools.product(candidates, repeat=m):
            if labels[0] not in seq[0] or len(set(seq)) < m or set().union(*seq) != set(labels):
                continue
            together = {frozenset(p) for s in seq for p in itertools.combinations(s, 2)}
            if together.issuperset(need) and all(_consecutive(seq, lab) for lab in labels):
                key = (-len(together), tuple(tuple(index[lab] for lab in s) for s in seq))
                best = min(best or (key, seq), (key, seq))
        if best is not None:
            return best[1]
    pairs_text = ", ".join(" and ".join(sorted(p, key=index.get)) for p in need)
    raise ValueError(f"no order of resident sets of at most {most} servers holds {pairs_text} together "
                     "with every arm's sets consecutive")


def set_of_window(n_windows: int, n_sets: int, instances: int = 1) -> list[int]:
    """The resident set of every window: each of `instances` contiguous blocks cut into `n_sets` sub-blocks
    in the sets' order."""
    out = [0] * n_windows
    for block in split_blocks(n_windows, instances):
        for k, sub in enumerate(split_blocks(len(block), n_sets)):
            for i in sub:
                out[block[i]] = k
    return out


def build_schedule(n_windows: int, loads: tuple[float, ...], labels: tuple[str, ...],
                   one_at_a_time: bool = False, blocks: int = 2, seed: int = 0,
                   sets: Sequence[tuple[str, ...]] | None = None, instances: int = 1) -> list[Step]:
    """Every (window, load) cell once, windows outer, loads in the given order, with its arm order;
    with two or more resident `sets`, each of `instances` blocks of windows split among them in order
    (set_of_window) and each cell's order one of its set's arms only."""
    if len(labels) < 2 or len(set(labels)) != len(labels):
        raise ValueError(f"need two or more distinct arm labels, got {labels}")
    rng = np.random.default_rng(seed)
    if sets is not None and len(sets) > 1:
        owner = set_of_window(n_windows, len(sets), instances)
        drawn = {(j, k): iter(balanced_orders(tuple(s), owner.count(k), rng))
                 for j in range(len(loads)) for k, s in enumerate(sets)}
        return [Step(w, load, j, next(drawn[(j, owner[w])]), resident_set=owner[w])
                for w in range(n_windows) for j, load in enumerate(loads)]
    if one_at_a_time:
        groups = split_blocks(n_windows, blocks)
        steps = []
        for k, (windows, order) in enumerate(zip(groups, balanced_orders(labels, len(groups), rng))):
            steps += [Step(w, load, j, order, block=k) for w in windows for j, load in enumerate(loads)]
        return steps
    per_load = [balanced_orders(labels, n_windows, rng) for _ in loads]
    return [Step(w, load, j, per_load[j][w]) for w in range(n_windows) for j, load in enumerate(loads)]


def simultaneous_schedule(n_windows: int, loads: tuple[float, ...], labels: tuple[str, ...]) -> list[Step]:
    """The duet's cells: every (window, load) once, windows outer, each replayed to all arms at once
    (the order is the labels': it records no sequence; experiments.stats.duet places the arms on GPUs)."""
    return [Step(w, load, j, tuple(labels)) for w in range(n_windows) for j, load in enumerate(loads)]


def segments(steps: list[Step], one_at_a_time: bool) -> list[Segment]:
    """The server segments that execute `steps`: one with every arm (one per resident set), or one per
    (block, arm)."""
    if not steps:
        return []
    if not one_at_a_time:
        return set_segments(steps, steps)
    out: list[Segment] = []
    for block in sorted({s.block for s in steps}):
        in_block = tuple(s for s in steps if s.block == block)
        out += [Segment((arm,), in_block, block or 0) for arm in in_block[0].order]
    return out


def set_segments(steps: Sequence[Step], every: Sequence[Step], block: int = 0) -> list[Segment]:
    """One segment per stretch of consecutive `steps` of one resident set (all of them without sets), in
    `block`, its arms the order of that set's first step in `every` (the run's steps)."""
    arms: dict[int | None, tuple[str, ...]] = {}
    for s in every:
        arms.setdefault(s.resident_set, tuple(s.order))
    return [Segment(arms[k], tuple(group), block)
            for k, group in itertools.groupby(steps, key=lambda s: s.resident_set)]


def burnin_step(steps: list[Step], loads: tuple[float, ...], arms: tuple[str, ...]) -> Step:
    """The burn-in cell replayed after a server start, on ``arms``: at the highest load, the first window
    those arms replay together (window 0 when every arm replays every cell)."""
    top = max(range(len(loads)), key=lambda j: loads[j])
    first = next((s for s in steps if s.load_index == top and set(arms) <= set(s.order)), None)
    window, order = (first.window, first.order) if first is not None else (0, arms)
    return Step(window, loads[top], top, tuple(a for a in order if a in arms))


def burnin_seed(run_seed: int, burnin: int) -> int:
    """Prompt seed of the burn-in after the ``burnin``-th server start: distinct from every replay_seed,
    so the measured replay of window 0 does not find the burn-in's prompts in the prefix cache."""
    return (run_seed << 32) | (1 << 31) | (burnin << 8)


KNEE_PROMPT_SEEDS = "per window"  # run.json "knee" "prompt_seeds" of a search seeded as knee_seed does


def knee_seed(run_seed: int, factor_index: int, window: int) -> int:
    """Prompt seed of the knee search's replay of ``window`` at its ``factor_index``-th factor: distinct
    from every replay_seed and burnin_seed, and per window, so that the windows pooled at one factor do
    not share prompt prefixes (request i of each would start with the same ids, and the prefix cache
    would serve them: seen on the H200 in h200-llama8b-confirm, where it moved the knee from about 8x
    to 24x)."""
    return (run_seed << 32) | (1 << 30) | ((window + 1) << 8) | factor_index


def replay_seed(run_seed: int, window: int, load_index: int) -> int:
    """Prompt seed of one (window, load) replay, the same for every arm and distinct across cells.

    Distinct seeds keep the server's prefix cache from reusing one replay's prompts in another
    (loadgen draws request i's prompt from (seed, i)). window -1 is the warm-up.
    """
    return (run_seed << 32) | ((window + 1) << 8) | load_index
