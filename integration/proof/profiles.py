"""Step profiles measured inside vLLM (`integration.proof.prove`), read back with their version checked.

A profile holds, per decode or prefill step of `batch_tokens` tokens, the stock step time and the
norm kernels' GPU time per step in the stock and the patched engine. experiments/ reads profiles
only through `load_profile` and finds the committed ones through `default_profile`, which looks
them up in the index runtime_tables/profiles.json by GPU and mode (data, not code: a new GPU's profiles
are added there; it names files of the runtime_tables package, each copied from a prove run named in
its "copied_from"); `default_graph_steps` finds a GPU's and model's CUDA-graph step times there or
beside the GPU's calibration record.
"""

from __future__ import annotations

from pathlib import Path

import runtime_tables
from common.jsonfile import ResultFileError, read_json
from integration import calibrate

SCHEMA_VERSION = 1  # written by integration.proof.evidence.profile_from_raw
# {"schema_version", "profiles": {gpu: {mode: name}}, ...}, names of runtime_tables files
INDEX = runtime_tables.path("profiles.json")
PROJECT_ROOT = Path(__file__).resolve().parents[2]  # research tools read evidence files from here


def load_profile(path: str | Path) -> list[dict]:
    """Profile rows sorted by batch_tokens, each {"batch_tokens","step_us","norm_stock_us","norm_patched_us"}.

    The patched norm time includes `patched_extra_kernels_us` ({kernel: us per step}): work Inductor
    fused into its norm kernel that the patched step must run separately (the profile's definition).
    ResultFileError names the file and what is wrong."""
    data = read_json(path, SCHEMA_VERSION, "step profile")
    rows = data.get("steps")
    if not isinstance(rows, list) or not rows:
        raise ResultFileError(f"{path}: expected a non-empty 'steps' list of per-step rows")
    out = []
    for i, row in enumerate(rows):
        try:
            out.append({"batch_tokens": float(row["batch_tokens"]), "step_us": float(row["step_us_stock"]),
                        "norm_stock_us": float(row["norm_us_stock"]),
                        "norm_patched_us": float(row["norm_us_patched"])
                        + sum(float(us) for us in row.get("patched_extra_kernels_us", {}).values())})
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ResultFileError(f"{path}: steps[{i}]: need batch_tokens, step_us_stock, norm_us_stock, "
                                  f"norm_us_patched ({exc!r})") from None
    return sorted(out, key=lambda r: r["batch_tokens"])


def default_profile(gpu: str | None, mode: str) -> Path | None:
    """The committed profile the attribution uses for this GPU (short name, e.g. h200) and mode
    ('compiled' or 'eager'), a runtime_tables file; None where there is none."""
    if gpu is None or not INDEX.is_file():
        return None
    index = read_json(INDEX, SCHEMA_VERSION, "profile index").get("profiles") or {}
    name = (index.get(gpu) or {}).get(mode)
    return runtime_tables.path(name) if name else None


def _indexed(section: str, gpu: str | None, model: str | None) -> Path | None:
    """The index's file of `section` for this GPU and model, a runtime_tables file."""
    if gpu is None or model is None or not INDEX.is_file():
        return None
    name = ((read_json(INDEX, SCHEMA_VERSION, "profile index").get(section) or {}).get(gpu) or {}).get(model)
    return runtime_tables.path(name) if name else None


def default_planted_steps(gpu: str | None, model: str | None) -> Path | None:
    """The committed graph-steps file with a planted arm's step time for this GPU and model (its
    directory name, e.g. llama-3.1-8b), a runtime_tables file; None where there is none."""
    return _indexed("planted_steps", gpu, model)


def default_graph_steps(gpu: str | None, model: str | None) -> Path | None:
    """The committed graph-steps file with the stock engine's CUDA-graph decode step times for this GPU
    and model: the index's "graph_steps" entry (files made by hand), else the one integration.calibrate
    kept beside the GPU's calibration record for that model; None where neither has one."""
    found = _indexed("graph_steps", gpu, model)
    if found is None and gpu is not None and model is not None:
        found = calibrate.graph_steps_file(gpu, model)
    return found
