"""integration.compilecache: the arms whose table decides their compiled graphs get caches per table."""

from __future__ import annotations

from pathlib import Path

import pytest

from integration import arms, choice, compilecache, names


@pytest.fixture(autouse=True)
def _own_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv(names.POLICY_ENV, raising=False)
    monkeypatch.delenv(names.POLICY_ENV_COMPILED, raising=False)
    monkeypatch.setattr(choice, "current_gpu", lambda: "h200")  # the committed H200 tables by default


def test_patched_and_plugin_idle_never_share_a_compiled_graph(tmp_path: Path) -> None:
    patched = compilecache.cache_env(arms.get("patched"), eager=False, cuda=True)
    idle = compilecache.cache_env(arms.get("plugin-idle"), eager=False, cuda=True)
    planted = compilecache.cache_env(arms.get("planted:1us"), eager=False, cuda=True)
    assert set(patched) == set(compilecache.CACHE_VARS) and patched != idle
    assert planted == patched  # one table: the twin may load patched's graphs (its kernel builds at run time)
    assert Path(patched["VLLM_CACHE_ROOT"]).is_relative_to(tmp_path / "cache" / "rmsnorm-goodput" / "compile")
    # arms outside the policy, eager processes and machines without CUDA keep vLLM's own caches
    assert compilecache.cache_env(arms.get("stock"), eager=False, cuda=True) == {}
    assert compilecache.cache_env(arms.get("patched"), eager=True, cuda=True) == {}
    assert compilecache.cache_env(arms.get("patched"), eager=False, cuda=False) == {}


def test_the_key_follows_the_table_contents_not_its_name(tmp_path: Path) -> None:
    shipped, eager_table = choice.policy_path("compiled"), choice.policy_path("eager")
    assert shipped is not None and shipped.is_file() and eager_table is not None
    default = compilecache.table_key({})
    copy = tmp_path / "copy.json"
    copy.write_bytes(shipped.read_bytes())
    both = {names.POLICY_ENV_COMPILED: str(copy), names.POLICY_ENV: str(eager_table)}
    assert compilecache.table_key(both) == default  # the same bytes decide the same graphs
    copy.write_bytes(shipped.read_bytes().replace(b"}", b" }", 1))
    assert compilecache.table_key(both) != default  # one byte more: a cache of its own
    assert compilecache.table_key({names.POLICY_ENV: names.ALL_FUSED}) != default
    assert compilecache.table_key({names.POLICY_ENV: str(tmp_path / "gone.json")}) != default
