"""`cts serve`: the GPU plan (pure logic), the commands it would run, and the endpoints file."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cts.cli import app
from cts.eval.run.config import load_experiment
from cts.foundation.yaml_config import ConfigError
from cts.serving.model_config import ModelConfig, build_engine
from cts.serving.server_group import EndpointsError, ServerGroup, read_endpoints
from cts.serving.server_plan import (
    PlanError,
    dry_run_text,
    only_models,
    plan_gpus,
    plan_replicas,
    plan_servers,
    served_models,
)
from cts.serving.types import ChatRequest, Message, Sampling
from cts.serving.vllm_server import ServerError
from tests.conftest import vllm_python


def model(name: str, tp: int = 1, memory: float = 0.9, **vllm: object) -> ModelConfig:
    return ModelConfig(
        name=name,
        path=f"/ckpt/{name}",
        engine="openai",
        vllm={"tensor_parallel_size": tp, "gpu_memory_utilization": memory, **vllm},
    )


GPUS = ["0", "1", "2", "3"]


def test_largest_models_are_packed_first_onto_whole_gpus():
    models = {
        "searcher": model("WebDancer-32B", tp=2),
        "judge": model("Qwen3-32B", tp=1),
        "clarifier": model("Qwen3-8B", tp=1),
    }
    assert plan_gpus(models, GPUS) == {"searcher": ["0", "1"], "judge": ["2"], "clarifier": ["3"]}


def test_small_models_share_a_gpu_by_memory_fraction():
    models = {"a": model("a", memory=0.45), "b": model("b", memory=0.45), "c": model("c")}
    plan = plan_gpus(models, ["0", "1"])
    assert plan["c"] == ["0"] and plan["a"] == plan["b"] == ["1"]


def test_explicit_gpus_are_honoured_and_checked():
    models = {"a": model("a", gpus=[3]), "b": model("b", tp=2)}
    assert plan_gpus(models, GPUS) == {"a": ["3"], "b": ["0", "1"]}
    with pytest.raises(PlanError, match=r"model a: vllm.gpus \['7'\] names GPU\(s\) \['7'\]"):
        plan_gpus({"a": model("a", gpus=[7])}, GPUS)
    with pytest.raises(PlanError, match="lists 1 GPU"):
        plan_gpus({"a": model("a", tp=2, gpus=[0])}, GPUS)


def test_refuses_when_the_models_do_not_fit():
    models = {"big": model("big", tp=4), "small": model("small", memory=0.5)}
    with pytest.raises(PlanError, match=r"model small needs 1 GPU\(s\) with 50% .* free") as e:
        plan_gpus(models, GPUS)
    assert "big on ['0', '1', '2', '3']" in str(e.value)
    with pytest.raises(PlanError, match="this job has no GPU"):
        plan_gpus({"a": model("a")}, [])


def test_models_sharing_a_gpu_leave_five_percent_of_it():
    """CUDA contexts and graphs sit outside vLLM's gpu_memory_utilization: two models at 0.5
    on one GPU overcommit it; the plan hands out at most 0.95 of each GPU."""
    assert plan_gpus({"a": model("a", memory=0.5), "b": model("b", memory=0.45)}, ["0"]) == {
        "a": ["0"],
        "b": ["0"],
    }
    with pytest.raises(PlanError, match=r"model b needs 1 GPU\(s\) with 50% .*95% of each GPU"):
        plan_gpus({"a": model("a", memory=0.5), "b": model("b", memory=0.5)}, ["0"])
    explicit = {"a": model("a", memory=0.5, gpus=[0]), "b": model("b", memory=0.5, gpus=[0])}
    with pytest.raises(PlanError, match=r"model b: GPU\(s\) \['0'\] have \[0.45\]"):
        plan_gpus(explicit, ["0"])
    with pytest.raises(PlanError, match="CUDA contexts and graphs"):
        plan_gpus({"a": model("a", memory=0.97)}, ["0"])


def test_replicas_get_gpus_of_their_own_and_auto_fills_what_is_left():
    models = {"judge": model("J", tp=2, replicas=2), "clarifier": model("C", replicas="auto")}
    # The judge's two copies take 0,1 and 2,3 of 6 GPUs; the clarifier fills the other two.
    plan = plan_replicas(models, ["0", "1", "2", "3", "4", "5"])
    assert plan == {"judge": [["0", "1"], ["2", "3"]], "clarifier": [["4"], ["5"]]}
    small = {"a": model("a", memory=0.3, replicas="auto"), "b": model("b", memory=0.45)}
    assert plan_replicas(small, ["0"]) == {"a": [["0"]], "b": [["0"]]}  # 0.3 more: over 0.95
    assert plan_replicas({"a": model("a", memory=0.3, replicas="auto")}, ["0"])["a"] == [["0"]] * 3
    with pytest.raises(PlanError, match="model judge #2 needs 2 GPU"):
        plan_replicas({"judge": model("J", tp=2, replicas=2)}, ["0", "1", "2"])
    with pytest.raises(ValueError, match=r"vllm\.replicas: with vllm\.gpus"):
        model("J", replicas=2, gpus=[0])


def test_each_copy_is_a_server_and_the_endpoints_file_lists_them_all(tmp_path: Path):
    models = {"judge": model("J", replicas=2, port=8100), "clarifier": model("C")}
    planned = plan_servers(models, tmp_path, cpu=True, python="/venv/bin/python")
    assert [(p.label, p.port) for p in planned[:2]] == [("judge", 8100), ("judge #2", 8101)]
    assert [p.server.log_path.name for p in planned] == [
        "judge.log",
        "judge.2.log",
        "clarifier.log",
    ]
    assert "# judge #2 (J) on GPU(s) none (CPU), port 8101" in dry_run_text(planned)
    file = tmp_path / "endpoints.json"
    file.write_text(json.dumps(ServerGroup(planned).endpoints()))
    urls = read_endpoints(file)
    assert urls == {
        "judge": ["http://127.0.0.1:8100/v1", "http://127.0.0.1:8101/v1"],
        "clarifier": planned[2].server.base_url,
    }
    resolved = load_experiment(None, ["roles.judge.model=smollm2-135m-instruct-vllm"])
    pointed = resolved.with_endpoints({"smollm2-135m-instruct-vllm": urls["judge"]})
    assert pointed.model_for("judge").endpoint == urls["judge"]


def checkpoint(folder: Path, template: str | None, where: str = "tokenizer_config.json") -> Path:
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    tokenizer: dict[str, str] = {}
    if template is not None and where == "tokenizer_config.json":
        tokenizer["chat_template"] = template
    elif template is not None:
        (folder / where).write_text(template)
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer))
    return folder


def test_a_served_checkpoint_without_a_chat_template_is_refused_before_it_starts(tmp_path):
    """Every role sends chat messages: a base checkpoint without a chat template would answer
    each with an error, after a long start. Refused at plan time, naming the way out."""
    base = checkpoint(tmp_path / "base", None)
    served = ModelConfig(name="b", path=str(base), engine="openai")
    with pytest.raises(PlanError, match=r"model judge: checkpoint .*base ships no chat template"):
        plan_servers({"judge": served}, tmp_path, gpus=["0"])
    given = served.model_copy(
        update={"vllm": served.vllm.model_copy(update={"extra_args": ["--chat-template", "t"]})}
    )
    assert plan_servers({"judge": given}, tmp_path, gpus=["0"])
    for where, folder in (("tokenizer_config.json", "a"), ("chat_template.jinja", "b")):
        ok = checkpoint(tmp_path / folder, "{{ messages }}", where)
        assert plan_servers({"judge": served.model_copy(update={"path": str(ok)})}, tmp_path, ["0"])
    result = CliRunner().invoke(
        app,
        [
            "serve",
            "--set",
            "roles.judge.model=m",
            "--set",
            "models.m.name=m",
            "--set",
            f"models.m.path={base}",
            "--set",
            "models.m.engine=openai",
            "--gpus",
            "0",
            "--dry-run",
        ],
    )
    assert result.exit_code == 2 and "ships no chat template" in result.output


def test_only_openai_models_with_serve_on_are_served():
    models = {
        "served": model("served"),
        "external": model("external", serve=False),
        "inproc": ModelConfig(name="x", path="/x", engine="transformers"),
    }
    assert list(served_models(models)) == ["served"]


def test_plan_carries_flags_env_and_ports(tmp_path):
    models = {
        "clarifier": model(
            "Qwen3-8B",
            memory=0.4,
            max_model_len=32768,
            extra_args=["--enable-lora", "--lora-modules", "ft=/ckpt/adapter dir"],
            env={"VLLM_LOGGING_LEVEL": "INFO"},
            port=8123,
        )
    }
    (p,) = plan_servers(models, tmp_path, gpus=["2", "5"])
    command = p.server.command()
    assert command[:3] == ["vllm", "serve", "/ckpt/Qwen3-8B"]
    assert command[command.index("--port") + 1] == "8123"
    assert command[command.index("--gpu-memory-utilization") + 1] == "0.4"
    assert command[command.index("--max-model-len") + 1] == "32768"
    assert command[-3:] == ["--enable-lora", "--lora-modules", "ft=/ckpt/adapter dir"]
    assert p.server.env == {"VLLM_LOGGING_LEVEL": "INFO", "CUDA_VISIBLE_DEVICES": "2"}
    assert p.server.log_path == tmp_path / "clarifier.log"
    (cpu,) = plan_servers(models, tmp_path, cpu=True, python="/venv/bin/python")
    assert cpu.server.command()[:3] == [
        "/venv/bin/python",
        "-m",
        "vllm.entrypoints.openai.api_server",
    ]
    assert "--gpu-memory-utilization" not in cpu.server.command()
    assert "CUDA_VISIBLE_DEVICES" not in cpu.server.env


def test_a_job_runs_the_vllm_beside_its_interpreter_when_path_has_none(tmp_path, monkeypatch):
    """A Slurm job runs the venv's python by absolute path without activating the venv: its
    `vllm` is not on PATH. The server must start from the one beside the interpreter (a bare
    `vllm serve` died with FileNotFoundError before any model loaded)."""
    venv = tmp_path / "venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").symlink_to(sys.executable)
    argv_file = tmp_path / "argv"
    stand_in = venv / "vllm"
    stand_in.write_text(f'#!/bin/sh\necho "$@" > {shlex.quote(str(argv_file))}\n')
    stand_in.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(venv / "python"))
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    (p,) = plan_servers({"m": model("M")}, tmp_path, gpus=["0"])
    assert p.server.command()[:2] == [str(stand_in), "serve"]
    p.server.start()
    assert p.server.process is not None and p.server.process.wait(timeout=30) == 0
    assert argv_file.read_text().split()[:2] == ["serve", "/ckpt/M"]

    stand_in.unlink()  # no vllm anywhere: a clear error, not a traceback
    with pytest.raises(ServerError, match=r"no `vllm` to run .*--vllm-python"):
        p.server.start()


def test_dry_run_prints_the_plan_and_quoted_commands(tmp_path, monkeypatch):
    monkeypatch.delenv("CTS_VLLM_PYTHON", raising=False)  # `vllm serve`, not the CPU venv
    result = CliRunner().invoke(
        app,
        [
            "serve",
            "--set",
            "roles.clarifier.model=smollm2-135m-instruct-vllm",
            "--gpus",
            "0",
            "--output-dir",
            str(tmp_path / "run dir"),
            "--dry-run",
        ],
    )
    assert result.exit_code == 0, result.output
    comment, command = result.output.strip().splitlines()
    assert comment.startswith("# smollm2-135m-instruct-vllm (smollm2-135m-instruct) on GPU(s) 0")
    argv = shlex.split(command)
    assert argv[:4] == ["CUDA_VISIBLE_DEVICES=0", "VLLM_CPU_KVCACHE_SPACE=2", "vllm", "serve"]
    assert '{"backend": "xgrammar", "disable_any_whitespace": true}' in argv


def test_a_plan_that_does_not_fit_exits_2(tmp_path):
    result = CliRunner().invoke(
        app,
        [
            "serve",
            "--set",
            "roles.clarifier.model=smollm2-135m-instruct-vllm",
            "--set",
            "models.smollm2-135m-instruct-vllm.vllm.tensor_parallel_size=2",
            "--gpus",
            "0",
            "--dry-run",
        ],
    )
    assert result.exit_code == 2
    assert "GPU plan error: model smollm2-135m-instruct-vllm needs 2 GPU(s)" in result.output


def test_endpoints_file_errors_are_clear(tmp_path):
    with pytest.raises(EndpointsError, match="endpoints file not found"):
        read_endpoints(tmp_path / "missing.json")
    with pytest.raises(EndpointsError, match=r"not found after waiting 0.01 s \(is the shared"):
        read_endpoints(tmp_path / "missing.json", wait_s=0.01)
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(EndpointsError, match="not an endpoints file"):
        read_endpoints(bad)
    # Damaged as no `cts serve` writes it: nested 100k deep, huge, or a device that never ends.
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(EndpointsError, match="nested too deeply"):
        read_endpoints(deep)
    huge = tmp_path / "huge.json"
    huge.write_text('{"models": {}, "pad": "' + "x" * (2 << 20) + '"}')
    with pytest.raises(EndpointsError, match="larger than 1 MiB"):
        read_endpoints(huge)
    with pytest.raises(EndpointsError, match="not a regular file"):
        read_endpoints(Path("/dev/zero"))


def test_endpoints_replace_the_served_models_urls(tmp_path: Path):
    resolved = load_experiment(None, ["roles.judge.model=smollm2-135m-instruct-vllm"])
    file = tmp_path / "endpoints.json"
    file.write_text(
        json.dumps({"models": {"smollm2-135m-instruct-vllm": {"base_url": "http://h:9/v1"}}})
    )
    pointed = resolved.with_endpoints(read_endpoints(file))
    assert pointed.model_for("judge").endpoint == "http://h:9/v1"
    assert pointed.model_for("clarifier").endpoint is None


TWO_MODELS = """
name: serve-test
roles:
  clarifier: {model: tiny-a}
  judge: {model: tiny-b}
models:
"""
TINY_SERVED = """
  {key}:
    name: {key}
    path: "tiny:smollm2-135m-instruct"
    engine: openai
    dtype: float32
    vllm:
      max_model_len: 1024
      extra_args: ["--enforce-eager"]
      env: {{VLLM_CPU_KVCACHE_SPACE: "1"}}
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.vllm
@pytest.mark.slow
def test_cts_serve_on_cpu_then_a_dead_server_stops_them_all(tmp_path, tiny_path):
    """Two real vllm-cpu servers: ready detection, the endpoints file, a request through it;
    then one server is killed and `cts serve` stops the other and names the dead one."""
    python = vllm_python()
    config = tmp_path / "two.yaml"
    config.write_text(TWO_MODELS + "".join(TINY_SERVED.format(key=k) for k in ("tiny-a", "tiny-b")))
    run_dir = tmp_path / "run"
    endpoints = run_dir / "endpoints.json"
    command = [sys.executable, "-m", "cts", "serve", "-c", str(config), "--cpu"]
    command += ["--vllm-python", python, "--output-dir", str(run_dir), "--ready-timeout", "600"]
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 660
        while not endpoints.exists():
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "servers not ready"
            time.sleep(1)
        served = json.loads(endpoints.read_text())["models"]
        assert set(served) == {"tiny-a", "tiny-b"}
        for entry in served.values():
            assert Path(entry["log"]).is_file() and _alive(entry["pid"])

        resolved = load_experiment(config).with_endpoints(read_endpoints(endpoints))
        engine = build_engine(resolved.model_for("clarifier"))
        request = ChatRequest(
            messages=(Message(role="user", content="Say hello."),),
            sampling=Sampling(max_tokens=8),
        )

        async def ask() -> int:
            try:
                return (await engine.chat(request)).usage.completion_tokens
            finally:
                await engine.aclose()

        assert asyncio.run(ask()) > 0

        os.killpg(served["tiny-b"]["pid"], signal.SIGKILL)
        _, err = process.communicate(timeout=120)
        assert process.returncode == 1
        assert "server error: model tiny-b: vLLM server (tiny-b, port" in err
        assert "exited with code" in err and "last lines of" in err
        assert not _alive(served["tiny-a"]["pid"]) and not endpoints.exists()
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=60)


def test_a_dead_server_stops_the_run_and_is_raised():
    """`cts run --serve` polls the servers while it runs; a death cancels the run."""
    from cts.eval.experiment import until_signalled
    from cts.eval.run.runner import RunOutcome

    async def work() -> RunOutcome:
        await asyncio.sleep(60)
        return RunOutcome()

    polls: list[int] = []

    def watch() -> None:
        polls.append(1)
        if len(polls) == 3:
            raise ServerError("model judge: vLLM server exited with code -9")

    with pytest.raises(ServerError, match="model judge"):
        asyncio.run(until_signalled(work(), watch, poll_s=0.01))
    assert len(polls) == 3


def test_hard518_fits_one_8_gpu_node_and_webdancer_keeps_its_release_sampling():
    resolved = load_experiment("hard518")
    served = served_models(resolved.model_configs)
    assert set(served) == set(resolved.model_configs)  # every role is served by vLLM
    plan = plan_gpus(served, [str(g) for g in range(8)])
    assert sorted(g for gpus in plan.values() for g in gpus) == [str(g) for g in range(8)]
    with pytest.raises(PlanError):
        plan_gpus(served, ["0", "1", "2", "3"])
    searcher = resolved.sampling_for("searcher")
    assert (searcher.temperature, searcher.top_p, searcher.repetition_penalty) == (0.6, 0.95, 1.1)
    assert resolved.output_dir() == Path("runs/hard518-qwen3-8b")


# -- many fine-tunes on one base server (LoRA) -------------------------------------------------

LORA_EXPERIMENT = (
    """
name: lora-test
roles:
  clarifier: {model: base}
  rewriter: {model: rewriter-ft}
  user_answerer: {model: answerer-ft}
models:"""
    + TINY_SERVED.format(key="base")
    + """  rewriter-ft: {name: tiny-rewriter, path: "tiny:smollm2-135m-instruct", engine: openai,
                lora_of: base, adapter: models/adapters/smollm2-135m-rewriter}
  answerer-ft: {name: tiny-answerer, path: "tiny:smollm2-135m-instruct", engine: openai,
                lora_of: base, adapter: models/adapters/smollm2-135m-answerer}
"""
)


def test_adapters_are_served_by_their_base_s_server_under_their_own_names(tmp_path: Path):
    config = tmp_path / "lora.yaml"
    config.write_text(LORA_EXPERIMENT)
    resolved = load_experiment(config)
    assert set(served_models(resolved.model_configs)) == {"base"}  # one server, not three
    (server,) = plan_servers(resolved.model_configs, tmp_path, cpu=True, python="/p")
    args = server.server.args
    modules = args[args.index("--lora-modules") + 1 :]
    assert [m.split("=")[0] for m in modules] == ["tiny-rewriter", "tiny-answerer"]
    assert modules[0].endswith("cts/configs/models/adapters/smollm2-135m-rewriter")
    assert "--enable-lora" in args and args[args.index("--max-loras") + 1] == "2"
    assert args[args.index("--max-lora-rank") + 1] == "8"  # the adapters' r
    pointed = resolved.with_endpoints({"base": "http://h:1/v1"})
    assert pointed.model_for("rewriter").endpoint == "http://h:1/v1"
    assert pointed.model_for("rewriter").name == "tiny-rewriter"  # what requests carry


def test_an_adapter_needs_a_base_that_cts_serve_starts(tmp_path: Path):
    config = tmp_path / "lora.yaml"
    in_process = "engine: transformers\n    dtype"
    config.write_text(LORA_EXPERIMENT.replace("engine: openai\n    dtype", in_process))
    with pytest.raises(ConfigError, match="model rewriter-ft: lora_of base: its server must be"):
        load_experiment(config)
    only = LORA_EXPERIMENT.replace("  clarifier: {model: base}\n", "")
    config.write_text(only)
    assert "base" in load_experiment(config).model_configs  # pulled in by lora_of
    config.write_text(only.replace("lora_of: base", "lora_of: nothing", 1))
    with pytest.raises(ConfigError, match="model rewriter-ft: lora_of: no model config 'nothing'"):
        load_experiment(config)
    with pytest.raises(ValueError, match="lora_of: needs engine 'openai' and the `adapter`"):
        ModelConfig(name="x", path="p", engine="openai", lora_of="base")


@pytest.mark.vllm
@pytest.mark.slow
def test_one_cpu_server_answers_as_each_adapter_as_the_transformers_engine_does(tmp_path):
    """One real vllm-cpu server of the tiny base with two shipped adapters: each adapter's name
    answers, greedy, with the very text the transformers engine gives with that adapter."""
    from cts.serving.server_group import ServerGroup, serving

    config = tmp_path / "lora.yaml"
    config.write_text(LORA_EXPERIMENT)
    resolved = load_experiment(config)
    planned = plan_servers(resolved.model_configs, tmp_path, cpu=True, python=vllm_python())
    request = ChatRequest(
        messages=(Message(role="user", content="Rewrite: cheap flights to Oslo in May"),),
        sampling=Sampling(max_tokens=24),
    )

    async def ask(model: ModelConfig) -> str:
        engine = build_engine(model)
        try:
            return (await engine.chat(request)).text
        finally:
            await engine.aclose()

    with serving(ServerGroup(planned, deadline_s=600)) as group:
        pointed = resolved.with_endpoints({"base": group.planned[0].server.base_url})
        roles = ("rewriter", "user_answerer", "clarifier")
        served = {role: asyncio.run(ask(pointed.model_for(role))) for role in roles}
    for role, key in (("rewriter", "rewriter-ft"), ("user_answerer", "answerer-ft")):
        local = resolved.model_configs[key].model_copy(
            update={"engine": "transformers", "lora_of": None, "dtype": "float32"}
        )
        assert served[role] == asyncio.run(ask(local)), role
    assert served["rewriter"] != served["clarifier"]  # the base answers otherwise


def test_a_dead_copy_is_lost_while_its_model_has_another_but_a_last_copy_stops_the_group(
    tmp_path: Path,
):
    models = {"judge": model("J", replicas=2), "clarifier": model("C")}
    planned = plan_servers(models, tmp_path, cpu=True, python="/p")
    group = ServerGroup(planned)
    live = [subprocess.Popen(["sleep", "600"]) for _ in planned]
    try:
        for p, process in zip(planned, live, strict=True):
            p.server.process = process
            group.ready_s[p.label] = 1.0
        group.check()
        live[1].kill()  # judge #2
        live[1].wait()
        group.check()
        assert group.lost == {"judge #2": -9}
        live[0].kill()  # the judge's last copy
        live[0].wait()
        with pytest.raises(ServerError, match="model judge: vLLM server"):
            group.check()
    finally:
        for process in live:
            process.kill()
            process.wait()


def test_cts_serve_loads_more_adapters_for_several_runs_and_keeps_them_with_their_base(
    tmp_path: Path,
):
    """`cts serve --adapters` adds clarifiers that no role of the experiment names (each run
    of another clarifier points at the one server with --endpoints); `--models base` keeps the
    adapters of that base."""
    config = tmp_path / "lora.yaml"
    config.write_text(LORA_EXPERIMENT)
    extra = tmp_path / "clarifier-ft.yaml"
    extra.write_text(
        "name: clarifier-ft\npath: tiny:smollm2-135m-instruct\nengine: openai\nlora_of: base\n"
        "adapter: models/adapters/smollm2-135m-judge\n"
    )
    result = CliRunner().invoke(
        app,
        ["serve", "-c", str(config), "--cpu", "--dry-run", "--adapters", str(extra)],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    assert "clarifier-ft=" in result.output and "tiny-rewriter=" in result.output
    assert "--max-loras 3" in result.output
    resolved = load_experiment(config).with_adapters([str(extra)])
    kept = only_models(resolved.model_configs, "base")
    assert set(kept) == {"base", "rewriter-ft", "answerer-ft", str(extra)}
    orphan = tmp_path / "orphan.yaml"
    orphan.write_text(extra.read_text().replace("lora_of: base", "lora_of: elsewhere"))
    with pytest.raises(ConfigError, match="its lora_of 'elsewhere' is not a model of this"):
        load_experiment(config).with_adapters([str(orphan)])
