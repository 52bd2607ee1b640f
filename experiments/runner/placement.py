"""Where a run's servers sit on the host and in which order they start: two things that may make two
instances of one arm differ, each a flag so that an A/A run can measure what it does.

`--pin-cpus`: every server the kit starts gets cores of its own (the API server and every process it
spawns inherit them: the affinity is set in the child before vLLM starts), the kit's own process (the
load generator) the rest, so no server's host-side work shares a core with another's or with the
client's. The split is by the cores this process may use, in order: `cores // (servers + 1)` each,
the kit keeping what is left; run.json "placement" records it.

`--start-order rotate`: at instance i (experiments.runner.instances) the servers start in the first
start's order rotated by i, in the same compile-cache waves (servers.start_waves), so which server
starts and allocates first changes from instance to instance and the interval over instances carries
what the order does; `waves` (the default) starts them in the same order every time.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from experiments.runner.config import START_ORDERS, ConfigError, RunConfig

KIT = "kit"  # the key of the kit's own cores in Placement.cpus


def add_arguments(ap: argparse.ArgumentParser) -> None:
    """The placement flags (their own group of `--help`)."""
    p = ap.add_argument_group("server placement (experiments/runner/placement.py)")
    p.add_argument("--pin-cpus", action="store_true",
                   help="own cores for every server, the rest for the kit (default: off)")
    p.add_argument("--start-order", choices=START_ORDERS, default="waves",
                   help="waves (default): the same start order at every instance; rotate: rotated by one")


@dataclass(frozen=True)
class Placement:
    """The run's cores per server label and for the kit (KIT; empty without --pin-cpus) and its
    start order."""

    cpus: Mapping[str, tuple[int, ...]]
    start_order: str = "waves"

    def of(self, label: str) -> tuple[int, ...]:
        """The cores of `label`'s server (empty: not pinned)."""
        return tuple(self.cpus.get(label, ()))

    def to_json(self) -> dict:
        return {"pin_cpus": {k: list(v) for k, v in self.cpus.items()}, "start_order": self.start_order}


def split_cores(labels: Sequence[str], cores: Sequence[int]) -> dict[str, tuple[int, ...]]:
    """label -> its cores and KIT -> the rest: `len(cores) // (len(labels) + 1)` consecutive cores per
    server, in order; ConfigError when that is less than one."""
    cores = sorted(cores)
    share = len(cores) // (len(labels) + 1)
    if share < 1:
        raise ConfigError(f"--pin-cpus: {len(cores)} cores cannot give each of {len(labels)} servers and "
                          f"the kit a core of its own; leave --pin-cpus off or run fewer arms")
    out = {label: tuple(cores[i * share:(i + 1) * share]) for i, label in enumerate(labels)}
    out[KIT] = tuple(cores[len(labels) * share:])
    return out


def placement_for(cfg: RunConfig, n_instances: int = 1, cores: Sequence[int] | None = None) -> Placement:
    """The Placement of `cfg` run on `n_instances` instances per arm (cores: those this process may
    use, by default); ConfigError for a lever the run cannot use: either where the kit does not start
    the servers or starts them otherwise, a rotation with one instance or one server at a time."""
    flags = (("--pin-cpus", cfg.pin_cpus), ("--start-order rotate", cfg.start_order != "waves"))
    asked = [f for f, on in flags if on]
    if asked and (cfg.endpoints or cfg.layout != "turns"):
        why = "--endpoint (the user started the servers)" if cfg.endpoints else "--layout duet"
        raise ConfigError(f"{' and '.join(asked)}: not with {why}")
    if cfg.start_order != "waves" and (n_instances < 2 or cfg.one_at_a_time):
        why = ("--one-at-a-time (each server starts alone, in its block's arm order)" if cfg.one_at_a_time
               else "one server instance per arm (it starts once): add --instances 2 or more")
        raise ConfigError(f"--start-order rotate: not with {why}")
    if not cfg.pin_cpus:
        return Placement({}, cfg.start_order)
    return Placement(split_cores(cfg.labels, sorted(os.sched_getaffinity(0)) if cores is None else cores),
                     cfg.start_order)


def rotated(order: Sequence[str], instance: int, start_order: str) -> tuple[str, ...]:
    """The start order of `instance`: `order` as it is, or with `rotate` rotated left by `instance`."""
    if start_order != "rotate" or not order:
        return tuple(order)
    k = instance % len(order)
    return tuple(order[k:]) + tuple(order[:k])


@contextmanager
def pinned(cpus: Sequence[int]) -> Iterator[None]:
    """This process on `cpus` while the block runs (nothing when empty), its own set restored after."""
    if not cpus:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, set(cpus))
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)
