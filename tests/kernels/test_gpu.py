"""The fused kernels on a CUDA GPU: against the reference, and captured in a CUDA graph."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from kernels.cases import EPS, TOLERANCES, TORCH_DTYPES
from kernels.reference import fused_add_rms_norm_ref, rms_norm_ref

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(),
                       reason="needs a CUDA GPU (torch.cuda.is_available() is False)"),
    pytest.mark.skipif(importlib.util.find_spec("cupy") is None, reason="needs CuPy (cupy-cuda13x)"),
]


def _close(out: torch.Tensor, ref: torch.Tensor, dtype: str) -> None:
    atol, rtol = TOLERANCES[dtype]
    torch.testing.assert_close(out.double(), ref, atol=atol, rtol=rtol)


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("rows,hidden", [(1, 111), (7, 769), (33, 5125), (300, 8192)])
def test_rms_norm_matches_reference(dtype: str, rows: int, hidden: int) -> None:
    from kernels.rmsnorm import rms_norm

    g = torch.Generator(device="cuda").manual_seed(rows * hidden)
    x = torch.randn(rows, hidden, generator=g, device="cuda").to(TORCH_DTYPES[dtype])
    w = (1 + 0.5 * torch.randn(hidden, generator=g, device="cuda")).to(TORCH_DTYPES[dtype])
    _close(rms_norm(x, w, EPS), rms_norm_ref(x, w, EPS), dtype)


@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_fused_add_matches_reference_strided_input(dtype: str) -> None:
    from kernels.rmsnorm import fused_add_rms_norm

    g = torch.Generator(device="cuda").manual_seed(5)
    big = torch.randn(9, 2 * 769, generator=g, device="cuda").to(TORCH_DTYPES[dtype])
    x = big[:, :769]  # rows strided by 2 * 769
    res = torch.randn(9, 769, generator=g, device="cuda").to(TORCH_DTYPES[dtype])
    w = torch.randn(769, generator=g, device="cuda").to(TORCH_DTYPES[dtype])
    ref_out, ref_res = fused_add_rms_norm_ref(x.clone(), res.clone(), w, EPS)
    fused_add_rms_norm(x, res, w, EPS)
    assert torch.equal(res, ref_res)
    _close(x, ref_out, dtype)


def test_cuda_graph_capture_and_replay() -> None:
    from kernels.rmsnorm import fused_add_rms_norm, rms_norm

    x = torch.randn(64, 4096, device="cuda", dtype=torch.bfloat16)
    r = torch.randn_like(x)
    w = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(x)
    x2, r2 = x.clone(), r.clone()
    rms_norm(x, w, EPS, out=out)  # compiles outside the capture
    fused_add_rms_norm(x2, r2, w, EPS)
    x2.copy_(x), r2.copy_(r)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        rms_norm(x, w, EPS, out=out)
        fused_add_rms_norm(x2, r2, w, EPS)
    out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    _close(out, rms_norm_ref(x, w, EPS), "bf16")
    ref_out, ref_res = fused_add_rms_norm_ref(x, r, w, EPS)
    assert torch.equal(r2, ref_res)
    _close(x2, ref_out, "bf16")


def test_errors_name_the_problem() -> None:
    from kernels.checks import UnsupportedInput
    from kernels.rmsnorm import rms_norm

    x = torch.randn(4, 64, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(UnsupportedInput, match="weight dtype torch.float32 differs"):
        rms_norm(x, torch.ones(64, device="cuda"), EPS)
    with pytest.raises(UnsupportedInput, match="not a CUDA device"):
        rms_norm(x.cpu(), torch.ones(64, dtype=torch.bfloat16), EPS)
    with pytest.raises(UnsupportedInput, match="rows are not contiguous"):
        rms_norm(x.t(), torch.ones(4, device="cuda", dtype=torch.bfloat16), EPS)


@pytest.mark.parametrize("head_dim,heads", [(64, 1), (128, 8), (128, 32), (256, 64)])
def test_head_norm_views_of_a_qkv_buffer(head_dim: int, heads: int) -> None:
    from kernels.rmsnorm import rms_norm

    g = torch.Generator(device="cuda").manual_seed(heads)
    qkv = torch.randn(9, (heads + 16) * head_dim, generator=g, device="cuda").to(torch.bfloat16)
    q = qkv[:, :heads * head_dim].view(9, heads, head_dim)  # token stride (heads + 16) * head_dim
    w = (1 + 0.5 * torch.randn(head_dim, generator=g, device="cuda")).to(torch.bfloat16)
    before = qkv.clone()
    out = rms_norm(q, w, EPS)
    _close(out, rms_norm_ref(q, w, EPS), "bf16")
    assert torch.equal(qkv, before)  # x is only read


@pytest.mark.parametrize("route", ["driver", "cupy"])
def test_pdl_chain_in_a_cuda_graph(route: str) -> None:
    if route == "driver":
        pytest.importorskip("cuda.bindings.driver", reason="needs cuda-bindings for cuLaunchKernelEx")
    from kernels import launch
    from kernels.rmsnorm import PLANS, fused_add_rms_norm

    launch.set_route(route)
    PLANS.clear()
    try:
        x = torch.randn(16, 4096, device="cuda", dtype=torch.bfloat16)
        r = torch.randn_like(x)
        w = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
        ref_x, ref_r = x.clone(), r.clone()
        for _ in range(20):  # the same chain eagerly, plain build
            fused_add_rms_norm(ref_x, ref_r, w, EPS, variant="t512r1")
        gx, gr = x.clone(), r.clone()
        fused_add_rms_norm(gx, gr, w, EPS, variant="t512r1p")  # builds outside the capture
        gx.copy_(x), gr.copy_(r)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(20):  # each call reads what the one before wrote
                fused_add_rms_norm(gx, gr, w, EPS, variant="t512r1p")
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(gr, ref_r) and torch.equal(gx, ref_x)
    finally:
        launch.set_route(None)
        PLANS.clear()


@pytest.mark.parametrize("route", ["driver", "cupy"])
@pytest.mark.parametrize("rows", [1, 257, 8192])
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_staged_builds_equal_the_register_build_bit_for_bit(route: str, rows: int, dtype: str) -> None:
    """Same threads per row, so the same sums in the same order: the staged, persistent build (its
    CTAs walk several row groups at 8192 rows; 64 KiB of shared memory for the bf16 fused add, past
    the default limit) writes what the register build writes, eagerly and replayed in a graph."""
    if route == "driver":
        pytest.importorskip("cuda.bindings.driver", reason="needs cuda-bindings for cuLaunchKernelEx")
    from kernels import launch
    from kernels.rmsnorm import PLANS, fused_add_rms_norm, rms_norm

    launch.set_route(route)
    PLANS.clear()
    try:
        g = torch.Generator(device="cuda").manual_seed(rows)
        tdt = TORCH_DTYPES[dtype]
        x = torch.randn(rows, 4096, generator=g, device="cuda").to(tdt)
        r = torch.randn(rows, 4096, generator=g, device="cuda").to(tdt)
        w = (1 + 0.5 * torch.randn(4096, generator=g, device="cuda")).to(tdt)
        shape = "t64r2" if dtype == "bf16" else "t128r1"
        assert torch.equal(rms_norm(x, w, EPS, variant=shape + "s"), rms_norm(x, w, EPS, variant=shape))
        ref_x, ref_r = x.clone(), r.clone()
        fused_add_rms_norm(ref_x, ref_r, w, EPS, variant=shape)
        sx, sr = x.clone(), r.clone()
        fused_add_rms_norm(sx, sr, w, EPS, variant=shape + "sp")
        assert torch.equal(sx, ref_x) and torch.equal(sr, ref_r)
        sx.copy_(x), sr.copy_(r)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            fused_add_rms_norm(sx, sr, w, EPS, variant=shape + "sp")
        sx.copy_(x), sr.copy_(r)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(sx, ref_x) and torch.equal(sr, ref_r)
    finally:
        launch.set_route(None)
        PLANS.clear()
