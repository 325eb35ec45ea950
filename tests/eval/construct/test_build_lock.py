"""One writer per shard of a building step: a second `cts data fuse|blur` on the same shard (the
same Slurm submit sent twice, a requeued task beside its old self) is refused as a second `cts
run` of a shard is, before it repairs or appends to the file the first one writes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from cts.eval.construct.fuse import parts_dir
from cts.eval.construct.store import BuildControl, BuildRow, RowStore, run_rows
from cts.eval.data.dataset import SAMPLE_DIR
from cts.eval.run.locks import ShardBusy, shard_count_lock, shard_lock
from cts.eval.run.run_dir import Shard
from cts.serving.scripted import scripted_roles
from tests.builders import cts, scripted_cli


def _work(made: list[str]) -> Callable[[], AsyncIterator[Callable[[str], Awaitable[BuildRow]]]]:
    @asynccontextmanager
    async def open_work() -> AsyncIterator[Callable[[str], Awaitable[BuildRow]]]:
        async def row(key: str) -> BuildRow:
            made.append(key)
            return BuildRow(key=key)

        yield row

    return open_work


def test_a_shard_another_process_is_building_is_refused_untouched(tmp_path: Path) -> None:
    store = RowStore(tmp_path / "out.parts", BuildRow)
    shard = Shard(0, 2)
    store.root.mkdir()
    # The other writer's file, its last line half written: ours must not cut it off.
    torn = '{"key": "a"}\n{"key": "c"'
    store.path(shard).write_text(torn)
    made: list[str] = []
    control = BuildControl(name="fuse", shard=shard, show_progress=False)
    with shard_lock(store.root, shard):  # as a live `cts data fuse --shard 0/2` holds it
        with pytest.raises(ShardBusy, match=r"shard 0/2 of this run is being run by another"):
            asyncio.run(run_rows(store, ["a", "b", "c", "d"], _work(made), control))
        # Another shard of the step is free.
        other = BuildControl(name="fuse", shard=Shard(1, 2), show_progress=False)
        outcome = asyncio.run(run_rows(store, ["a", "b", "c", "d"], _work(made), other))
    assert store.path(shard).read_text() == torn and made == ["b", "d"]
    assert (outcome.keys, outcome.ran, outcome.failed) == (2, 2, 0)
    # Once the other writer has ended, the shard runs: its torn line cut, its missing key run.
    outcome = asyncio.run(run_rows(store, ["a", "b", "c", "d"], _work(made), control))
    assert (outcome.keys, outcome.ran) == (2, 1) and made == ["b", "d", "c"]
    assert sorted(store.rows()) == ["a", "b", "c", "d"]


def test_a_step_under_another_shard_count_than_a_live_one_is_refused(tmp_path: Path) -> None:
    """`cts data fuse` unsharded beside a live `--shard 0/2` (or a resubmission with another
    count) made keys the live shard was making: 10 of 19 twice. Refused, as `cts run` is."""
    store = RowStore(tmp_path / "out.parts", BuildRow)
    made: list[str] = []
    whole = BuildControl(name="fuse", shard=Shard(), show_progress=False)
    with shard_count_lock(store.root, Shard(0, 2)):  # a live `--shard 0/2` of the step
        with pytest.raises(ShardBusy, match=r"another live process runs this run as 2 shard"):
            asyncio.run(run_rows(store, ["a", "b", "c"], _work(made), whole))
        # A shard of the same count runs beside it.
        other = BuildControl(name="fuse", shard=Shard(1, 2), show_progress=False)
        asyncio.run(run_rows(store, ["a", "b", "c"], _work(made), other))
    assert made == ["b"]
    asyncio.run(run_rows(store, ["a", "b", "c"], _work(made), whole))  # once it has ended
    assert sorted(store.rows()) == ["a", "b", "c"] and made == ["b", "a", "c"]


def test_cts_data_fuse_on_a_busy_shard_exits_as_cts_run_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scripted_cli(tmp_path, monkeypatch, scripted_roles)
    out = tmp_path / "fused.jsonl"
    raw = SAMPLE_DIR / "raw_queries.jsonl"
    with shard_lock(parts_dir(out), Shard(0, 1)):
        result = cts("data", "fuse", str(raw), "--out", str(out))
    assert result.exit_code == 1, result.output
    assert "fused.jsonl.parts/.shard-0-of-1.lock: shard 0/1 of this run is being run" in (
        result.output.replace("\n", "")
    )
    assert not (parts_dir(out) / "shard-0-of-1.jsonl").exists() and not out.exists()


def test_a_damaged_plan_json_is_an_error_naming_it(tmp_path: Path) -> None:
    """A step's own record of its settings cut short or scribbled over was a traceback."""
    from cts.eval.construct.store import SettingsChanged, check_settings

    root = tmp_path / "out.parts"
    check_settings(root, {"seed": 0}, "blurred")
    for damaged in ('{"seed": 0', "[1, 2]", "[" * 100_000):
        (root / "plan.json").write_text(damaged)
        with pytest.raises(SettingsChanged, match=r"plan.json: unreadable .* another --out"):
            check_settings(root, {"seed": 0}, "blurred")
