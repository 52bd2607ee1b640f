"""A server the user started: measured like a launched one, never started or stopped by the kit.

`Endpoint` has the part of `launcher.VllmServer`'s interface a run uses (url, model_name, launch,
is_alive, check_alive, log_tail, stop), so an arm can be an OpenAI-compatible server that is
already running (`--endpoint NAME=URL`). What the server is comes from the server itself where it
says so: `/v1/models` (the served model, its max length) and, for vLLM, `/metrics` (version and
cache configuration); everything else about the arm is what the user declared.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request

from integration.launcher import ServerDied

PROBE_TIMEOUT_S = 5.0


def normalize_url(url: str) -> str:
    """`http://host:port` from what a user may pass (a trailing `/`, or `/v1` as OpenAI clients
    take it); ValueError naming the URL otherwise."""
    parts = urllib.parse.urlsplit(url.strip())
    path = parts.path.rstrip("/")
    if path.endswith("/v1"):
        path = path[:-3]
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.port is None or path:
        raise ValueError(f"endpoint URL {url!r}: expected http://HOST:PORT (optionally ending in /v1)")
    return f"{parts.scheme}://{parts.netloc}"


def _get(url: str, timeout_s: float = PROBE_TIMEOUT_S) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as resp:
            return resp.status, resp.read().decode("utf-8", errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, ""


class Endpoint:
    """An arm's server at `url`, started by someone else."""

    def __init__(self, label: str, url: str) -> None:
        self.label = label
        self.url = normalize_url(url)
        self.model_name: str | None = None
        self.log_path = None  # the kit holds no log of a server it did not start
        self.proc = None
        self._last_error = ""

    def _models(self) -> dict:
        status, body = _get(f"{self.url}/v1/models")
        if status != 200:
            raise OSError(f"GET /v1/models answered {status}")
        data = json.loads(body).get("data") or []
        if not data:
            raise OSError("GET /v1/models lists no model")
        return data[0]

    def is_alive(self) -> bool:
        """Whether the server answers /v1/models now."""
        try:
            self._models()
            return True
        except (OSError, ValueError) as exc:
            self._last_error = f"{type(exc).__name__}: {exc}"
            return False

    def check_alive(self) -> None:
        """Raise ServerDied if the server does not answer."""
        if not self.is_alive():
            raise ServerDied(f"endpoint {self.label} at {self.url} does not answer ({self._last_error})")

    def launch(self, timeout_s: float = 60.0) -> "Endpoint":
        """Wait until the server answers (nothing is started) and read the model it serves."""
        deadline = time.monotonic() + timeout_s
        while not self.is_alive():
            if time.monotonic() >= deadline:
                raise ServerDied(f"endpoint {self.label} at {self.url} unreachable after {timeout_s:.0f} s "
                                 f"({self._last_error}); start it first, or check --endpoint")
            time.sleep(1.0)
        self.model_name = str(self._models()["id"])
        return self

    def log_tail(self, n: int = 40) -> str:
        return f"(endpoint {self.label} at {self.url} was started outside the kit: no log here)"

    def stop(self, timeout_s: float = 0.0) -> None:
        """Nothing: the kit never stops a server it did not start."""

    def kill(self) -> None:
        """Nothing: the kit never stops a server it did not start."""

    def describe(self) -> dict:
        """What the server says about itself: its /v1/models entry and, where it exposes them,
        the info metrics of /metrics (vLLM: `vllm:cache_config_info`), labels only."""
        out: dict = {"url": self.url, "started_by": "user", "model": self._models()}
        status, text = _get(f"{self.url}/metrics")
        if status == 200:
            from prometheus_client.parser import text_string_to_metric_families

            families = text_string_to_metric_families(text)
            out["metrics_info"] = {fam.name: [dict(s.labels) for s in fam.samples]
                                   for fam in families if fam.name.endswith("_info")}
        else:
            out["metrics_info"] = f"GET /metrics answered {status}"
        return out
