"""The order in which (window, load) pairs are replayed against the arms: pure functions.

Resident servers (default): every (window, load) pair is replayed against both arms back to back;
the order is AB when window + load index is even and BA otherwise, so that at every load the order
alternates from window to window and drift cancels in the paired differences.

One server at a time (--one-at-a-time): windows are split into contiguous blocks; in block b the
first arm (AB when b is even, BA when odd) replays all of the block's pairs, then its server is
stopped and the other arm's started for the same pairs.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Step:
    """One (window, load) pair, the arm order it is replayed in, and the arms done so far."""

    window: int
    load: float
    load_index: int
    order: tuple[str, str]
    block: int | None = None
    done: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        d = {"window": self.window, "load": self.load, "order": list(self.order), "done": list(self.done)}
        if self.block is not None:
            d["block"] = self.block
        return d


@dataclass(frozen=True)
class Segment:
    """A stretch of the run during which the same servers are up: `arms` resident, `steps` replayed."""

    arms: tuple[str, ...]
    steps: tuple[Step, ...]


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


def build_schedule(n_windows: int, loads: tuple[float, ...], labels: tuple[str, str],
                   one_at_a_time: bool = False, blocks: int = 2) -> list[Step]:
    """Every (window, load) pair once, windows outer, loads in the given order, with its arm order."""
    a, b = labels
    if one_at_a_time:
        steps = []
        for k, windows in enumerate(split_blocks(n_windows, blocks)):
            order = (a, b) if k % 2 == 0 else (b, a)
            steps += [Step(w, load, j, order, block=k) for w in windows for j, load in enumerate(loads)]
        return steps
    return [Step(w, load, j, (a, b) if (w + j) % 2 == 0 else (b, a))
            for w in range(n_windows) for j, load in enumerate(loads)]


def segments(steps: list[Step], one_at_a_time: bool) -> list[Segment]:
    """The server segments that execute `steps`: one with both arms, or one per (block, arm)."""
    if not steps:
        return []
    if not one_at_a_time:
        return [Segment(tuple(steps[0].order), tuple(steps))]
    out: list[Segment] = []
    for block in sorted({s.block for s in steps}):
        in_block = tuple(s for s in steps if s.block == block)
        out += [Segment((arm,), in_block) for arm in in_block[0].order]
    return out


def replay_seed(run_seed: int, window: int, load_index: int) -> int:
    """Prompt seed of one (window, load) replay, the same for both arms and distinct across pairs.

    Distinct seeds keep the server's prefix cache from reusing one replay's prompts in another
    (loadgen draws request i's prompt from (seed, i)). window -1 is the warm-up.
    """
    return (run_seed << 32) | ((window + 1) << 8) | load_index
