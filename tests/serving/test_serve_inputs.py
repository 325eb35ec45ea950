"""What `cts serve` and `cts run` are handed by hand: endpoints files of any shape, a --host that
is an IPv6 address, a model whose API key variable is unset. Each is a clear error or works;
none is a traceback."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from cts.cli import app
from cts.foundation.yaml_config import ConfigError
from cts.serving.server_group import EndpointsError, read_endpoints
from cts.serving.vllm_server import VllmServer, free_port
from tests.vllm_stand_in import Health

ROLES = ["clarifier", "user_answerer", "rewriter", "searcher", "summarizer"]


def experiment(tmp_path: Path, **judge: object) -> Path:
    """Every role scripted but the judge, an `openai` model `oj` with `judge`'s fields."""
    models: dict[str, dict[str, object]] = {
        f"s-{r}": {"name": f"s-{r}", "path": "scripted", "engine": "scripted", "script": r}
        for r in ROLES
    }
    models["oj"] = {
        "name": "oj-judge",
        "path": str(tmp_path / "no-ckpt"),
        "engine": "openai",
        "endpoint": "http://127.0.0.1:9/v1",
        **judge,
    }
    document = {
        "name": "inputs",
        "roles": {**{r: {"model": f"s-{r}"} for r in ROLES}, "judge": {"model": "oj"}},
        "models": models,
        "dataset": {"path": "sample", "split": "dev", "limit": 1},
        "search": {"backend": "local", "corpus": "sample", "top_k": 3},
        "conditions": ["blurred"],
        "seeds": [1],
        "cache": {"enabled": True, "path": str(tmp_path / "cache" / "responses.sqlite")},
        "output_dir": str(tmp_path / "runs" / "{name}"),
    }
    path = tmp_path / "inputs.yaml"
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


@pytest.mark.parametrize(
    ("document", "says"),
    [
        ({"models": {"oj": "http://127.0.0.1:8000/v1"}}, r"\(model oj: str where"),
        ({"models": {"oj": {"base_urls": []}}}, r"\(model oj: base_urls \(or base_url\)"),
        ({"models": {"oj": {"base_url": "127.0.0.1:8000/v1"}}}, r"\(model oj: '127.0.0.1"),
        ({"models": {"oj": {"base_urls": ["http://a/v1", 3]}}}, r"\(model oj: base_urls"),
        ({"models": [1]}, "no `models` mapping"),
        ([1], "no `models` mapping"),
    ],
    ids=["a-url-string", "no-url", "no-scheme", "not-a-string", "models-a-list", "a-list"],
)
def test_an_endpoints_file_of_any_other_shape_is_an_error_naming_the_model(
    tmp_path, document, says
):
    file = tmp_path / "endpoints.json"
    file.write_text(json.dumps(document))
    with pytest.raises(EndpointsError, match=rf"^{file}: not an endpoints file.*{says}"):
        read_endpoints(file)


def test_a_hand_written_endpoints_file_exits_2_without_a_traceback(tmp_path, monkeypatch):
    monkeypatch.setenv("CTS_HOME", str(tmp_path / "home"))
    file = tmp_path / "endpoints.json"
    file.write_text(json.dumps({"models": {"oj": "http://127.0.0.1:8000/v1"}}))
    config = experiment(tmp_path)
    result = CliRunner().invoke(app, ["run", "-c", str(config), "--endpoints", str(file)])
    assert result.exit_code == 2, result.output
    assert f"endpoints error: {file}: not an endpoints file (model oj: str where" in (result.output)


def test_an_unset_api_key_variable_exits_2_naming_the_model_and_field(tmp_path, monkeypatch):
    """It was an EngineError out of the engine's constructor: a traceback, exit 1."""
    monkeypatch.setenv("CTS_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("CTS_UNSET_AUDIT_KEY", raising=False)
    config = experiment(tmp_path, api_key_env="CTS_UNSET_AUDIT_KEY")
    run_dir = tmp_path / "run"
    result = CliRunner().invoke(app, ["run", "-c", str(config), "--output-dir", str(run_dir)])
    assert result.exit_code == 2, result.output
    assert "config error" in result.output
    assert "api_key_env names CTS_UNSET_AUDIT_KEY, which is not set" in result.output
    assert isinstance(result.exception, SystemExit)
    assert not (run_dir / "config.yaml").exists()  # refused before the run writes anything


class Health6(ThreadingHTTPServer):
    address_family = socket.AF_INET6


@pytest.mark.parametrize("host", ["::1", "::"])
def test_a_server_on_an_ipv6_host_gets_a_port_a_url_and_is_found_ready(host):
    """`--host ::` bound an IPv4 socket to an IPv6 address (gaierror), and the URLs held the
    address unbracketed (httpx InvalidURL): both tracebacks."""
    port = free_port(host)
    httpd = Health6((host, port), Health)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    server = VllmServer("ckpt", "m", Path("unused.log"), port=port, host=host)
    server.process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        assert server.wait_ready(deadline_s=60, poll_s=0.05) >= 0
    finally:
        server.process.kill()
        server.process.wait()
        httpd.shutdown()
        httpd.server_close()
    if host == "::1":
        assert server.base_url == f"http://[::1]:{port}/v1"
    else:  # every interface: reached by this machine's name
        assert server.base_url == f"http://{socket.gethostname()}:{port}/v1"


def test_cts_serve_plans_on_an_ipv6_host_and_refuses_one_it_cannot_listen_on(tmp_path, monkeypatch):
    monkeypatch.setenv("CTS_HOME", str(tmp_path / "home"))
    config = str(experiment(tmp_path, endpoint=None))
    args = ["serve", "-c", config, "--cpu", "--vllm-python", sys.executable, "--dry-run"]
    result = CliRunner().invoke(app, [*args, "--host", "::"])
    assert result.exit_code == 0, result.output
    assert "--host :: --port" in result.output
    result = CliRunner().invoke(app, [*args, "--host", "no-such-host.invalid"])
    assert result.exit_code == 2, result.output
    assert "--host no-such-host.invalid: not an address this machine can listen on" in (
        result.output
    )
    with pytest.raises(ConfigError):
        free_port("no-such-host.invalid")
