"""The collector pause of cts/eval/run/bulk.py: the collector is as it was after the block, however
the block ends, and an inner pause leaves an outer one in force."""

from __future__ import annotations

import gc

import pytest

from cts.eval.run.bulk import collector_paused


def test_the_collector_is_paused_in_the_block_and_restored_after() -> None:
    assert gc.isenabled()
    with collector_paused():
        assert not gc.isenabled()
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the inner block does not end the outer pause
    assert gc.isenabled()


def test_an_error_in_the_block_restores_the_collector() -> None:
    with pytest.raises(RuntimeError), collector_paused():
        raise RuntimeError("stop")
    assert gc.isenabled()


def test_a_collector_paused_before_stays_paused() -> None:
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
