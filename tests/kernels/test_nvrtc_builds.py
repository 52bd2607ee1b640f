"""Every build of the kernel (kernels/rmsnorm_common.cuh with rmsnorm.cu or rmsnorm_staged.cu) that
validation, the benchmark or a committed policy table can ask for compiles for sm_90 with NVRTC, on a
machine without a GPU (NVRTC needs none): a source change that breaks one build fails here, not on the
H200.

The builds are kernels.plans.BuildKey values, compiled with their own options as kernels.rmsnorm
passes them to CuPy's RawModule; every vector width a call of that dtype can get (16-byte vectors down
to scalar accesses, as alignment and strides decide at run time), plus the negative controls and a
planted build of every launch shape a policy table names, at its widest vector.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

nvrtc = pytest.importorskip("cuda.bindings.nvrtc", reason="cuda-bindings (the test extra) is not installed")

import runtime_tables  # noqa: E402 (after the skip)
from kernels import bench, cases, shapes  # noqa: E402 (after the skip)
from kernels.plans import BuildKey, build_key  # noqa: E402 (after the skip)
from kernels.plantedbounds import build_flag  # noqa: E402 (after the skip)
from kernels.rmsnorm import NEGATIVE_CONTROLS, SOURCE_DIR, kernel_source  # noqa: E402 (after the skip)

ARCH = b"--gpu-architecture=sm_90"


def _vecs(dtype: str) -> tuple[int, ...]:
    widest = shapes.VECTOR_BYTES // shapes.ITEMSIZE[dtype]
    return tuple(v for v in (8, 4, 2, 1) if v <= widest)


def _add(keys: set[BuildKey], op: str, dtype: str, hidden: int, vec: int, shape: shapes.LaunchShape,
         flags: tuple[str, ...] = ()) -> None:
    if shapes.shape_fits(shape, hidden, vec) is None:
        keys.add(build_key(op, dtype, hidden, vec, shape, True, flags))


def _policy_shapes() -> set[tuple[str, str, int, shapes.LaunchShape]]:
    out = set()
    for path in sorted(runtime_tables.DIR.rglob("policy-*.json")):  # every table, past runs' too
        for name, entries in json.loads(path.read_text(encoding="utf-8"))["table"].items():
            op, dtype, hidden = name.split("/")
            for _, choice in entries:
                if choice.startswith("fused:") and choice != "fused:auto":
                    out.add((op, dtype, int(hidden), shapes.LaunchShape.parse(choice.split(":", 1)[1])))
    return out


def all_builds() -> set[BuildKey]:
    """The builds validation (kernels.cases.full_cases), the benchmark grid's candidates and the
    committed policy tables can launch, with PDL where the shape asks for it."""
    keys: set[BuildKey] = set()
    for c in cases.full_cases():
        for vec in _vecs(c.dtype):
            shape = (shapes.LaunchShape.parse(c.variant) if c.variant
                     else shapes.auto_shape(c.rows, c.hidden, vec))
            _add(keys, c.op, c.dtype, c.hidden, vec, shape)
    for op, dtype, rows, hidden in bench.grid():
        vec = _vecs(dtype)[0] if hidden % _vecs(dtype)[0] == 0 else 1
        for shape in shapes.candidates(rows, hidden, vec):
            _add(keys, op, dtype, hidden, vec, shape)
    for op, dtype, hidden, shape in _policy_shapes():
        for vec in _vecs(dtype):
            _add(keys, op, dtype, hidden, vec, shape)
        for flag in (*NEGATIVE_CONTROLS.values(), build_flag(3000)):  # at the widest vector
            _add(keys, op, dtype, hidden, _vecs(dtype)[0], shape, (flag,))
    return keys


def _nvrtc(key: BuildKey, want_ptx: bool = False, extra: tuple[bytes, ...] = ()) -> tuple[bool, str]:
    """(compiled, text) of one build: its PTX when it compiled and want_ptx, else NVRTC's log."""
    err, prog = nvrtc.nvrtcCreateProgram(kernel_source(key.staged).encode(), b"rmsnorm.cu", 0, [], [])
    assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS, err
    opts = [ARCH, *(o.encode() for o in key.options()), *extra]
    try:
        (result,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        ok = result == nvrtc.nvrtcResult.NVRTC_SUCCESS
        size_of, get = ((nvrtc.nvrtcGetPTXSize, nvrtc.nvrtcGetPTX) if ok and want_ptx
                        else (nvrtc.nvrtcGetProgramLogSize, nvrtc.nvrtcGetProgramLog))
        _, size = size_of(prog)
        text = b" " * size
        get(prog, text)
        return ok, text.decode(errors="replace")
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def _compile(key: BuildKey) -> str | None:
    """None when NVRTC compiles the build, else its log."""
    ok, log = _nvrtc(key)
    return None if ok else log


def test_the_build_list_covers_every_dtype_op_pdl_and_flag() -> None:
    keys = all_builds()
    assert len(keys) > 500
    assert {k.dtype for k in keys} == {"fp32", "fp16", "bf16"}
    assert {k.fused_add for k in keys} == {False, True}
    assert {k.pdl for k in keys} == {False, True} and {k.vec for k in keys} == {1, 2, 4, 8}
    flags = {f for k in keys for f in k.flags}
    assert flags == {*NEGATIVE_CONTROLS.values(), build_flag(3000)}


@pytest.mark.slow
def test_every_build_compiles_for_sm90() -> None:
    keys = sorted(all_builds(), key=repr)
    with ThreadPoolExecutor(max_workers=2) as pool:
        logs = list(pool.map(_compile, keys))
    failed = [(k, log) for k, log in zip(keys, logs) if log is not None]
    assert not failed, (f"{len(failed)} of {len(keys)} builds fail, first {failed[0][0]}:\n"
                        f"{failed[0][1][:2000]}")


@pytest.mark.parametrize("staged", [False, True])
def test_a_broken_shared_header_fails_both_families_here(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                         staged: bool) -> None:
    for source in SOURCE_DIR.glob("rmsnorm*.cu*"):
        text = source.read_text()
        (tmp_path / source.name).write_text(text.replace("rsqrtf(", "rsqrt_typo("))
    monkeypatch.setattr("kernels.rmsnorm.SOURCE_DIR", tmp_path)
    log = _compile(BuildKey("bf16", True, 8, 256, 1, 2, True, (), staged))
    assert log is not None and "rsqrt_typo" in log


def _ptx(key: BuildKey) -> str:
    ok, text = _nvrtc(key, want_ptx=True)
    assert ok, text
    return text


@pytest.mark.parametrize("fused_add", [False, True])
def test_staged_builds_stage_through_shared_memory_and_register_builds_do_not(fused_add: bool) -> None:
    """The flags change the machine code as they say: the staged build copies rows with cp.async into
    dynamic shared memory and waits one group behind; the register build has none of it; PDL only
    where asked."""
    staged = _ptx(BuildKey("bf16", fused_add, 8, 64, 2, 8, True, (), True))
    plain = _ptx(BuildKey("bf16", fused_add, 8, 64, 2, 8, False, ()))
    assert "cp.async.cg.shared.global" in staged and "cp.async.wait_group 1" in staged
    assert ".extern .shared" in staged and "griddepcontrol.wait" in staged
    assert "cp.async" not in plain and ".extern .shared" not in plain and "griddepcontrol" not in plain
    narrow = _ptx(BuildKey("fp32", fused_add, 2, 32, 4, 2, False, (), True))  # 8-byte vectors go through L1
    assert "cp.async.ca.shared.global" in narrow and "cp.async.cg" not in narrow


@pytest.mark.slow  # every bf16 candidate compiled at every model width
def test_no_bf16_candidate_at_model_widths_spills_registers() -> None:
    """ptxas's own report (-v) for every launch shape the benchmark times on bf16 rows at hidden 2048,
    4096 and 8192, both ops, both families: a spill would put the row's registers in local memory."""
    keys = {build_key(op, "bf16", h, 8, shape, True) for op in ("rms_norm", "fused_add_rms_norm")
            for h in (2048, 4096, 8192) for rows in (1, 512, 8192) for shape in shapes.candidates(rows, h, 8)}
    assert any(k.staged for k in keys) and any(not k.staged for k in keys)
    with ThreadPoolExecutor(max_workers=2) as pool:
        logs = dict(zip(keys, pool.map(lambda k: _nvrtc(k, extra=(b"--ptxas-options=-v",)), keys)))
    spilled = [(k, log) for k, (ok, log) in logs.items()
               if not ok or "0 bytes spill stores, 0 bytes spill loads" not in log]
    assert not spilled, f"{len(spilled)} of {len(keys)} spill, first {spilled[0][0]}:\n{spilled[0][1][:1500]}"
    # negative control: the same report shows the spill of a build holding 32 vectors per thread in
    # registers (256 values: past MAX_ROW_FLOATS_PER_THREAD, which kernels.shapes never launches)
    ok, log = _nvrtc(BuildKey("bf16", True, 8, 32, 4, 32), extra=(b"--ptxas-options=-v",))
    assert ok and "0 bytes spill stores, 0 bytes spill loads" not in log and "spill stores" in log
