"""The benchmark's sizing (rotating buffers past L2, or one warm set) and its CLI errors, without a GPU."""

from __future__ import annotations

import pytest
import torch

from kernels import bench

L2 = 60 << 20  # the H200's L2


def test_cold_sizing_rotates_buffers_past_l2_and_warm_keeps_one_set() -> None:
    per_call = bench.bytes_moved("rms_norm", 256, 4096, 2)
    nbuf, calls = bench.sizing("rms_norm", 256, 4096, 2, L2)
    assert nbuf * per_call >= bench.WORKING_SET_TARGET * L2 and nbuf <= calls
    assert bench.sizing("rms_norm", 256, 4096, 2, L2, "warm") == (1, calls)
    big = bench.sizing("fused_add_rms_norm", 16384, 8192, 2, L2)
    assert big[0] * bench.bytes_moved("fused_add_rms_norm", 16384, 8192, 2) > L2  # already past L2
    with pytest.raises(ValueError, match="l2 must be one of"):
        bench.sizing("rms_norm", 1, 4096, 2, L2, "hot")


def test_cli_names_a_bad_l2_mode_and_a_missing_gpu(tmp_path, capsys) -> None:
    with pytest.raises(SystemExit):
        bench.main(["--out", str(tmp_path / "b.json"), "--l2", "hot"])
    assert "--l2: invalid choice: 'hot'" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert bench.main(["--out", str(tmp_path / "b.json"), "--l2", "warm"]) == 2
        assert "no CUDA GPU visible" in capsys.readouterr().err


def test_the_same_size_copy_keeps_its_samples_or_its_error() -> None:
    assert bench._copy_fields([3.0, 1.0, 2.0]) == {"copy_us": 2.0, "copy_samples_us": [3.0, 1.0, 2.0]}
    assert bench._copy_fields("RuntimeError: out of memory") == {"copy_error": "RuntimeError: out of memory"}
    assert bench._copy_fields(None) == {}  # fused add rows time no copy


def test_a_bad_hidden_list_is_named_by_argparse(capsys) -> None:
    with pytest.raises(SystemExit):
        bench.main(["--out", "b.json", "--hidden", "4096,abc"])
    assert "argument --hidden: '4096,abc': expected a comma list of integers" in capsys.readouterr().err
