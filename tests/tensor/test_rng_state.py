"""``fg.get_rng_state`` / ``fg.set_rng_state``: a restored state draws the same numbers again, per device."""

from __future__ import annotations

import numpy as np
import pytest

import flowgraph as fg


def test_restored_state_repeats_every_distribution(device):
    fg.manual_seed(3)
    state = fg.get_rng_state(device)
    assert state.dtype == fg.int64 and state.device == "cpu" and state.ndim == 1
    first = [fg.rand(7, device=device), fg.randn(2, 5, device=device), fg.randint(0, 9, (11,), device=device)]
    fg.set_rng_state(state, device)
    again = [fg.rand(7, device=device), fg.randn(2, 5, device=device), fg.randint(0, 9, (11,), device=device)]
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    after = fg.rand(7, device=device)  # the stream goes on from where the repeat ended, not from the start
    assert not np.array_equal(after.numpy(), first[0].numpy())


def test_odd_buffer_positions_are_part_of_the_state():
    fg.manual_seed(0)
    fg.randint(0, 5, (3,))  # leaves a partly used buffer on NumPy's Philox
    state = fg.get_rng_state()
    a = fg.rand(5)
    fg.set_rng_state(state)
    np.testing.assert_array_equal(a.numpy(), fg.rand(5).numpy())


def test_dropout_masks_repeat(device):
    x = fg.ones(64, 64, device=device)
    state = fg.get_rng_state(device)
    a = fg.nn.functional.dropout(x, 0.5, training=True)
    fg.set_rng_state(state, device)
    b = fg.nn.functional.dropout(x, 0.5, training=True)
    np.testing.assert_array_equal(a.numpy(), b.numpy())


def test_bad_state_names_the_argument_and_the_expected_form():
    with pytest.raises(fg.FlowError, match=r"new_state.*int64 vector of 13 words"):
        fg.set_rng_state(fg.zeros(3))
    with pytest.raises(fg.FlowError, match=r"new_state.*got a list"):
        fg.set_rng_state([1, 2, 3])
