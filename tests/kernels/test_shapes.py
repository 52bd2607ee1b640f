"""Vector width and launch-shape choice (pure Python)."""

from __future__ import annotations

import pytest

from kernels.shapes import MAX_HIDDEN, LaunchShape, auto_shape, iters_needed, shape_fits, vector_width


def test_vector_width_is_gcd_of_16_bytes_strides_and_pointers() -> None:
    assert vector_width(2, [4096], [0, 4096 * 2]) == 8  # bf16, aligned: 8 x 2 bytes
    assert vector_width(4, [4096], [0]) == 4  # fp32: 4 x 4 bytes
    assert vector_width(2, [4100], [0]) == 4  # row stride 4100 = 4 * 1025
    assert vector_width(2, [8193], [0]) == 1  # odd width: scalar accesses
    assert vector_width(2, [4096], [2]) == 1  # pointer one element off a 16-byte boundary
    assert vector_width(2, [40, 40], [0, 16]) == 8  # padded rows keep the 128-bit path


def test_launch_shape_names_and_limits() -> None:
    assert LaunchShape.parse("t256r1") == LaunchShape(256, 1)
    assert LaunchShape(8, 4).name == "t8r4"
    assert LaunchShape.parse("t512r1p") == LaunchShape(512, 1, True)
    assert LaunchShape(512, 1, True).name == "t512r1p"
    assert LaunchShape(512, 1, True).without_pdl() == LaunchShape(512, 1)
    assert LaunchShape.parse("t64r2s") == LaunchShape(64, 2, False, True)
    assert LaunchShape.parse("t64r2sp") == LaunchShape(64, 2, True, True)
    assert LaunchShape(64, 2, True, True).name == "t64r2sp"
    assert LaunchShape(64, 2, True, True).without_pdl().name == "t64r2s"
    for bad in ("warp", "t64r2ps", "t64r2x"):
        with pytest.raises(ValueError, match=r"expected 't<threads per row>r<rows per block>\[s\]\[p\]'"):
            LaunchShape.parse(bad)
    with pytest.raises(ValueError, match=r"expected 't<threads per row>r<rows per block>\[s\]\[p\]'"):
        LaunchShape.parse("warp")
    with pytest.raises(ValueError, match="multiple of 32"):
        LaunchShape(8, 1)  # 8 threads: not a whole warp
    with pytest.raises(ValueError, match="threads per row 48"):
        LaunchShape(48, 1)


def test_shape_fits_names_the_limit() -> None:
    assert shape_fits(LaunchShape(32, 4), 2048, 8) is None  # 8 vectors x 8 = 64 values per thread
    assert "needs 128 row values per thread" in shape_fits(LaunchShape(32, 4), 4096, 8)
    assert f"> {MAX_HIDDEN}" in shape_fits(LaunchShape(1024, 1), MAX_HIDDEN + 1, 1)
    assert iters_needed(5120, 8, 640) == 1 and iters_needed(8193, 1, 1024) == 9


@pytest.mark.parametrize("hidden,vec", [(1, 1), (31, 1), (33, 1), (127, 1), (2048, 8), (5120, 8),
                                        (8193, 1), (8192, 4), (65536, 8)])
@pytest.mark.parametrize("rows", [1, 7, 8192])
def test_auto_shape_always_fits(rows: int, hidden: int, vec: int) -> None:
    shape = auto_shape(rows, hidden, vec)
    assert shape_fits(shape, hidden, vec) is None
    assert shape.block % 32 == 0 and shape.block <= 1024


def test_auto_shape_is_deterministic_and_one_vector_per_thread() -> None:
    assert auto_shape(64, 4096, 8) == LaunchShape(512, 1)
    assert auto_shape(64, 4096, 8) == auto_shape(64, 4096, 8)
    assert auto_shape(8192, 128, 4) == LaunchShape(32, 4)  # narrow rows share a block


def test_candidates_time_pdl_and_staged_builds_only_in_their_row_ranges() -> None:
    from kernels.shapes import PDL_MAX_ROWS, STAGED_MIN_ROWS, candidates

    small, large = candidates(8, 4096, 8), candidates(PDL_MAX_ROWS + 1, 4096, 8)
    assert [s.name for s in small] == ["t512r1", "t256r1", "t128r1", "t512r1p", "t256r1p", "t128r1p"]
    assert [s.name for s in large] == ["t512r1", "t256r1", "t128r1", "t128r1s", "t64r2s"]
    mid = [s.name for s in candidates(STAGED_MIN_ROWS, 4096, 8)]
    assert mid[-2:] == ["t128r1sp", "t64r2sp"] and "t64r2s" in mid and len(mid) == 10
    assert not any(s.staged for s in candidates(STAGED_MIN_ROWS - 1, 4096, 8))
    assert all(shape_fits(s, 128, 8) is None for s in candidates(512, 128, 8))


def test_staged_shared_memory_and_persistent_grid() -> None:
    from kernels.shapes import persistent_grid, staged_smem_bytes

    # 128 threads x 8 vectors of 16 bytes, x and residual, two stages: 64 KiB
    assert staged_smem_bytes(LaunchShape(64, 2, staged=True), 4096, 8, 2, True) == 64 * 1024
    assert staged_smem_bytes(LaunchShape(64, 2, staged=True), 4096, 8, 2, False) == 32 * 1024
    assert staged_smem_bytes(LaunchShape(32, 4, staged=True), 33, 1, 4, False) == 2 * 4 * 33 * 4
    # 64 KiB + 1 KiB reserved: 3 CTAs in 228 KiB; 132 SMs
    assert persistent_grid(4096, 128, 64 * 1024, 132) == 3 * 132
    assert persistent_grid(100, 128, 64 * 1024, 132) == 100  # never more CTAs than row groups
    assert persistent_grid(10 ** 6, 1024, 0, 132) == 2 * 132  # threads bound: 2048 per SM
    assert persistent_grid(10 ** 6, 32, 0, 132) == 32 * 132  # CTAs per SM bound
    assert persistent_grid(10 ** 6, 128, 300 * 1024, 132) == 132  # at least one per SM
