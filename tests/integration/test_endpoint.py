"""integration.endpoint: a server the user started, measured and never started or stopped by the kit."""

from __future__ import annotations

import pytest

from integration.endpoint import Endpoint, normalize_url
from integration.launcher import ServerDied, VllmServer, free_port


@pytest.mark.parametrize(("given", "want"), [
    ("http://127.0.0.1:8000", "http://127.0.0.1:8000"), ("http://127.0.0.1:8000/", "http://127.0.0.1:8000"),
    ("http://127.0.0.1:8000/v1", "http://127.0.0.1:8000"), ("https://gpu-box:443/v1/", "https://gpu-box:443"),
])
def test_urls_as_users_write_them(given: str, want: str) -> None:
    assert normalize_url(given) == want


@pytest.mark.parametrize("bad", ["127.0.0.1:8000", "http://host", "http://host:80/api", "ftp://h:1"])
def test_bad_urls_are_refused_with_the_url(bad: str) -> None:
    with pytest.raises(ValueError, match="expected http://HOST:PORT"):
        normalize_url(bad)


def test_an_unreachable_endpoint_is_a_server_death_naming_it() -> None:
    ep = Endpoint("mine", f"http://127.0.0.1:{free_port()}/v1")
    assert not ep.is_alive()
    with pytest.raises(ServerDied, match=r"endpoint mine at http://127.0.0.1:\d+ unreachable after 1 s"):
        ep.launch(timeout_s=1.0)
    ep.stop()  # never touches a server it did not start


@pytest.mark.server
def test_a_running_vllm_server_is_measured_as_it_is(stock_server: VllmServer) -> None:
    ep = Endpoint("theirs", stock_server.url + "/v1").launch(timeout_s=30)
    assert ep.model_name == stock_server.model_name and ep.is_alive()
    info = ep.describe()
    assert info["started_by"] == "user" and info["model"]["id"] == stock_server.model_name
    assert "block_size" in info["metrics_info"]["vllm:cache_config_info"][0]  # vLLM's cache config
    ep.stop()
    assert stock_server.is_alive()  # the kit stopped nothing
