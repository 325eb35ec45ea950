"""The smaller findings of the third probe: malformed `allow_hosts` entries, site-local IPv6,
a `nan` score bound, error responses without the security headers, a `|` in an experiment
name, and `--host 0` spellings of every interface."""

from __future__ import annotations

import pytest
from starlette.testclient import TestClient
from typer.testing import CliRunner

import cts.eval.viewer.app
from cts.cli import app as cts_app
from cts.eval.report.html import to_html
from cts.eval.report.markdown import MAIN_COLUMNS, _main_table
from cts.eval.run.config import load_experiment
from cts.eval.viewer.app import SECURITY_HEADERS, make_app
from cts.eval.viewer.listen import allowed_hosts
from cts.eval.viewer.view import Viewer
from cts.foundation.yaml_config import ConfigError
from cts.webdancer.ssrf import BlockedURL, check_url
from cts.webdancer.visit import HttpPages
from tests.eval.viewer.test_view import LOCAL
from tests.eval.viewer.test_view import client as client  # the fixtures
from tests.eval.viewer.test_view import run as run

# -- allow_hosts --------------------------------------------------------------------------------


@pytest.mark.parametrize("entry", [":80", "a:1:2", "host:", "[x]:80", "[::1]x", "bad host", ""])
def test_a_malformed_allow_hosts_entry_is_a_config_error_naming_it(entry):
    with pytest.raises(ConfigError, match=r"search\.allow_hosts.*allow_hosts entry"):
        load_experiment("quickstart", [f"search.allow_hosts=['{entry}']"])
    with pytest.raises(ValueError, match="allow_hosts entry"):
        HttpPages(allow_hosts=[entry])


def test_well_formed_allow_hosts_entries_still_load():
    entries = ["mirror.example:8080", "intranet", "[::1]:8080", "10.0.0.5:80", "fe80::1%eth0"]
    loaded = load_experiment("quickstart", [f"search.allow_hosts={entries}"])
    assert loaded.experiment.search.allow_hosts == entries


@pytest.mark.parametrize("address", ["fec0::1", "feff:ffff::1"])
def test_a_site_local_ipv6_address_is_refused(address):
    with pytest.raises(BlockedURL, match="site-local"):
        check_url("http://intranet.example/", resolver=lambda host, port: [address])


# -- the viewer ---------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "NaN"])
def test_a_score_bound_that_is_not_finite_is_a_400_naming_it(client, value):
    for name in ("score_min", "score_max"):
        response = client.get("/api/records", params={name: value})
        assert response.status_code == 400, response.text[:200]
        assert response.json()["error"].startswith(f"{name}: expected a finite number")


def test_every_response_carries_the_security_headers(run, monkeypatch):
    viewer = Viewer([run[0]])
    monkeypatch.setattr(viewer, "facets", lambda: 1 / 0)  # a bug: a 500
    with TestClient(
        make_app(viewer, allowed_hosts("127.0.0.1")), LOCAL, raise_server_exceptions=False
    ) as c:
        answers = {
            "404 path": c.get("/nope"),
            "405 method": c.post("/api/runs"),
            "400 parameter": c.get("/api/records", params={"sort": "x"}),
            "400 host": c.get("/api/ping", headers={"host": "evil.example"}),
            "500 bug": c.get("/api/runs"),
            "200": c.get("/api/ping"),
        }
    assert [a.status_code for a in answers.values()] == [404, 405, 400, 400, 500, 200]
    for what, answer in answers.items():
        for name, value in SECURITY_HEADERS.items():
            assert answer.headers.get(name) == value, (what, name)


@pytest.mark.parametrize("host", ["0", "0x0", "0.0"])
def test_host_spellings_of_every_interface_serve_as_every_interface(run, monkeypatch, host):
    """`--host 0` binds 0.0.0.0 as `--host 0.0.0.0` does: the same Host list and warning."""
    served: dict[str, list[str]] = {}
    make = cts.eval.viewer.app.make_app

    def capture(viewer, hosts):  # type: ignore[no-untyped-def]
        served["hosts"] = hosts
        return make(viewer, hosts)

    monkeypatch.setattr(cts.eval.viewer.app, "make_app", capture)
    monkeypatch.setattr("uvicorn.Server.run", lambda self, sockets=None: None)
    result = CliRunner().invoke(cts_app, ["view", str(run[0]), "--port", "0", "--host", host])
    assert result.exit_code == 0, result.output
    assert served["hosts"] == ["*"] == allowed_hosts("0.0.0.0")
    assert "(0.0.0.0: every interface): anyone who can reach this machine" in result.output


# -- the report ---------------------------------------------------------------------------------


def test_a_pipe_in_a_system_name_stays_in_its_cell():
    name = "exp|with|pipes (model\\x) [run]"
    lines = _main_table([(name, {"scores": {}}), ("plain", {"scores": {}})], "exclude")
    page = to_html("\n".join(lines), [])
    rows = page.split("<tr>")[2:]
    assert len(rows) == 2
    assert rows[0].count("<td>") == 1 + len(MAIN_COLUMNS)
    assert "<td>exp|with|pipes (model\\x) [run]</td>" in rows[0]
