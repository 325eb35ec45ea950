"""Resampling in bulk, as the pure-Python loops did it one draw at a time.

cts/eval/score/metrics.py's bootstrap and sign-flip statistics once drew from
``random.Random(seed)`` (``choices`` of instance indices, ``choice`` of signs) and averaged with
``sum()``. This module gives the same draws as numpy arrays, from numpy's MT19937 started in
Random's state, and sums them as ``sum()`` does, so the vectorised statistics reproduce the loops'
numbers bit for bit. A plan, (n, b) blocks with one column per resample, is kept for re-use when
small: a report computes every interval and test of a table on the same instances with the same
seed.
"""

from __future__ import annotations

import functools
import random
import sys
from collections.abc import Callable, Iterable, Iterator

import numpy as np

# Python 3.12 made sum() of floats compensated (Neumaier); before, it added left to right. The
# resampled means are summed as the running interpreter's sum() would, which is what makes the
# vectorised statistics equal to the loops they replaced.
COMPENSATED_SUM = sys.version_info >= (3, 12)
#: Draws generated at a time (n × resamples in a block), bounding memory for any resample count.
BLOCK_DRAWS = 1 << 20
#: Resampling plans up to this many draws are kept: a report draws the same plan (seed 0, its
#: paired n, 10 000 resamples) for every interval and test it computes. A kept plan takes 8
#: bytes a draw (41 MB for 518 instances × 10 000 resamples); at most 4 are kept.
CACHED_DRAWS = 1 << 23

Blocks = Callable[[int, int, int], Iterator[np.ndarray]]


def twister(seed: int) -> np.random.MT19937:
    """numpy's MT19937 in the state ``random.Random(seed)`` starts in: the same generator, so
    its raw 32-bit words are the words Random's methods consume, in the same order."""
    words = random.Random(seed).getstate()[1]
    bits = np.random.MT19937()
    bits.state = {
        "bit_generator": "MT19937",
        "state": {"key": np.array(words[:-1], dtype=np.uint32), "pos": words[-1]},
    }
    return bits


def random_k(bits: np.random.MT19937, count: int) -> np.ndarray:
    """The next ``count`` values of ``Random.random()`` as the integers k of k / 2**53: the
    high 27 bits of one word over the high 26 of the next, as CPython builds them."""
    words = bits.random_raw(2 * count)
    return (words[0::2] >> 5) << 26 | words[1::2] >> 6


def index_blocks(seed: int, n: int, resamples: int) -> Iterator[np.ndarray]:
    """The indices ``rng.choices(range(n), k=n)`` draws, resample after resample, from
    ``random.Random(seed)``, as (n, b) blocks: column r of a block is one resample, row i its
    i-th draw. choices() takes ``floor(random() * n)``; random() is 53 bits from two words."""
    bits = twister(seed)
    per_block = max(1, BLOCK_DRAWS // n)
    for start in range(0, resamples, per_block):
        b = min(per_block, resamples - start)
        k = random_k(bits, b * n).astype(np.float64)
        # k · (n / 2**53) rounds the same product as (k / 2**53) · n: scaling by a power of two
        # is exact. The product is ≥ 0, so truncation is floor().
        drawn = (k * (n / 9007199254740992.0)).astype(np.intp)
        yield np.ascontiguousarray(drawn.reshape(b, n).T)


def sign_blocks(seed: int, n: int, resamples: int) -> Iterator[np.ndarray]:
    """The signs ``rng.choice((-1, 1))`` draws, n per resample, from ``random.Random(seed)``, as
    (n, b) blocks of ±1 like ``index_blocks``. choice() of two items takes getrandbits(2), the
    top two bits of one word, until they are below 2 (a word with its top bit set is skipped):
    0 picks −1, 1 picks +1."""
    bits = twister(seed)
    per_block = max(1, BLOCK_DRAWS // n)
    spare = np.empty(0, dtype=np.uint64)
    for start in range(0, resamples, per_block):
        b = min(per_block, resamples - start)
        need = b * n
        kept: list[np.ndarray] = [spare]
        have = len(spare)
        while have < need:
            top = bits.random_raw(2 * (need - have) + 64) >> 30
            kept.append(top[top < 2])
            have += len(kept[-1])
        tops = np.concatenate(kept)
        spare = tops[need:]  # accepted draws of the next resamples, in stream order
        signs = tops[:need].astype(np.float64) * 2.0 - 1.0
        yield np.ascontiguousarray(signs.reshape(b, n).T)


@functools.lru_cache(maxsize=4)
def cached_plan(blocks: Blocks, seed: int, n: int, resamples: int) -> tuple[np.ndarray, ...]:
    whole = np.concatenate(list(blocks(seed, n, resamples)), axis=1)
    whole.flags.writeable = False
    return (whole,)


def plan(blocks: Blocks, seed: int, n: int, resamples: int) -> Iterable[np.ndarray]:
    """The draws of ``blocks``, kept for the next statistic when they are small enough (and the
    seed is a plain int, so that equal keys mean equal draws)."""
    if resamples <= 0:
        return ()
    if type(seed) is int and n * resamples <= CACHED_DRAWS:
        return cached_plan(blocks, seed, n, resamples)
    return blocks(seed, n, resamples)


def gathered(table: np.ndarray, block: np.ndarray) -> Iterator[np.ndarray]:
    """Row i: ``table[block[i]]``, the i-th draw of every resample (rows) for every column of an
    (n, k) table, as a (resamples, k) array. One buffer is refilled for every row: a fresh array
    per row costs about as much as the work. Drawing whole rows of the table, columns side by
    side, reads each drawn index once for all the columns: 16 columns cost about 5 times one."""
    out = np.empty((block.shape[1], table.shape[1]))
    for row in block:
        # The drawn indices lie in [0, n) by construction, so "wrap" changes none of them; it
        # skips the bounds check that makes numpy's default mode a quarter slower.
        np.take(table, row, axis=0, out=out, mode="wrap")
        yield out


def resampled_means(table: np.ndarray, block: np.ndarray) -> np.ndarray:
    """(resamples, k): each resample's mean of each column of an (n, k) table, summed as
    ``sum()`` sums (``python_sum``) and divided by n, for the resamples of one block."""
    n, k = table.shape
    # numpy's take copies rows of up to 32 bytes of a power-of-two size (1, 2 or 4 columns) by
    # a fast path and other widths by memmove: 3 columns padded to 4 take 16 ms, not 31
    # (518 × 10 000 draws); wider tables gain nothing from padding. It is cut off after the
    # sum: summing a view that skips it costs about twice as much.
    wide = 4 if k == 3 else k
    if wide != k:
        table = np.concatenate([table, np.zeros((n, wide - k))], axis=1)
    return python_sum(gathered(table, block))[:, :k] / n


def signed(diffs: np.ndarray, signs: np.ndarray) -> Iterator[np.ndarray]:
    """Row i: ``signs[i] * diffs[i]`` for an (n, k) table of differences, as a (k, flips)
    array: the i-th signed difference (exactly ±d) of every column and flip, refilling one
    buffer like ``gathered``. Columns are the outer axis here: each row is then k products of
    one difference with a whole row of signs, which numpy does fastest."""
    out = np.empty((diffs.shape[1], signs.shape[1]))
    for d, row in zip(diffs, signs, strict=True):
        np.multiply(row[None, :], d[:, None], out=out)
        yield out


def python_sum(rows: Iterable[np.ndarray]) -> np.ndarray:
    """Elementwise what ``sum()`` returns for the rows' values in order: 0 + the first (which
    turns −0.0 into 0.0), then each added left to right; on Python ≥ 3.12 with CPython's
    Neumaier compensation, same expressions and same final correction. Each row is used before
    the next is asked for, so a producer may hand out one buffer refilled."""
    it = iter(rows)
    total = next(it) + 0.0
    if not COMPENSATED_SUM:
        for row in it:
            total += row
        return total
    lost = np.zeros_like(total)
    for x in it:
        t = total + x
        lost += np.where(np.abs(total) >= np.abs(x), (total - t) + x, (x - t) + total)
        total = t
    return np.where((lost != 0) & np.isfinite(lost), total + lost, total)


def ascending(values: np.ndarray) -> np.ndarray | list[float]:
    """``sorted()`` of the values: numpy's stable sort orders floats as Python does, but with a
    NaN Python's order depends on where the NaNs stood, so that case is left to Python."""
    if np.isnan(values).any():
        return sorted(values.tolist())
    return np.sort(values, kind="stable")
