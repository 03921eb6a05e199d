"""The packed-key sorts give exactly NumPy's stable argsort and unique, whatever the keys."""

from __future__ import annotations

from functools import partial

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from shardwise.files.records import edges, gather_targets, gather_values, vectors
from shardwise.files.sorting import group_rows, group_starts, sort_with_order, unique_inverse

INT64 = np.iinfo(np.int64)
# Narrow and full ranges: one packed pass, and two radix passes for keys over 64 - log2(n) bits.
KEYS = st.one_of(
    hnp.arrays(np.int64, st.integers(0, 300), elements=st.integers(-3, 3)),
    hnp.arrays(np.int64, st.integers(0, 300), elements=st.integers(INT64.min, INT64.max)),
    hnp.arrays(np.int64, st.integers(0, 300),
               elements=st.sampled_from([INT64.min, -1, 0, 2**40, INT64.max])),
    hnp.arrays(st.sampled_from([np.int32, np.uint32, np.int8, np.uint64]), st.integers(0, 50)),
)


@settings(max_examples=300, deadline=None)
@given(keys=KEYS)
def test_sort_with_order_is_numpys_stable_argsort(keys: np.ndarray) -> None:
    expected = np.argsort(keys, kind="stable")
    ordered, order = sort_with_order(keys)
    assert order.tolist() == expected.tolist()
    assert ordered.dtype == keys.dtype and ordered.tolist() == keys[expected].tolist()


@settings(max_examples=200, deadline=None)
@given(keys=KEYS)
def test_unique_inverse_is_numpys_unique(keys: np.ndarray) -> None:
    values, inverse = unique_inverse(keys)
    expected_values, expected_inverse = np.unique(keys, return_inverse=True)
    assert values.tolist() == expected_values.tolist()
    assert inverse.tolist() == expected_inverse.tolist()


@settings(max_examples=200, deadline=None)
@given(keys=KEYS.filter(lambda keys: keys.dtype == np.int64))
def test_group_rows_are_the_stable_order_cut_at_each_new_key(keys: np.ndarray) -> None:
    records = edges(keys, np.arange(keys.size), np.arange(keys.size) / 2)
    rows, indptr, (dst, weight) = group_rows(keys, partial(gather_targets, records))
    order = np.argsort(keys, kind="stable")
    assert rows.tolist() == np.unique(keys).tolist()
    assert dst.tolist() == order.tolist() and weight.tolist() == (order / 2).tolist()
    assert indptr.tolist() == [0, *np.cumsum(np.unique(keys, return_counts=True)[1]).tolist()]


@settings(max_examples=50, deadline=None)
@given(size=st.integers(0, 40), features=st.integers(0, 5), seed=st.integers(0, 2**32 - 1))
def test_vectors_gathered_whole_are_numpys_row_gather(size: int, features: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    records = vectors(rng.integers(0, 9, size), rng.random((size, features)))
    order = rng.permutation(size)
    gathered = gather_values(records, order)
    assert gathered.shape == (size, features)
    assert gathered.tolist() == records["values"][order].tolist()


def test_large_inputs_of_wide_keys_sort_stably() -> None:
    rng = np.random.default_rng(5)
    keys = rng.integers(INT64.min, INT64.max, 200_000, endpoint=True)
    keys[::7] = keys[3]  # many equal keys, whose order must be kept
    assert np.array_equal(sort_with_order(keys)[1], np.argsort(keys, kind="stable"))


def test_group_starts_marks_each_run() -> None:
    assert group_starts(np.array([], dtype=np.int64)).tolist() == []
    assert group_starts(np.array([2, 2, 2])).tolist() == [True, False, False]
