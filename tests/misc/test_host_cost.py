"""``benchmarks/host_cost.py`` counts a call's bytecodes and calls: on functions whose counts are known."""

from benchmarks.host_cost import count


def _leaf(n):
    return n + 1


def _caller():
    total = 0
    for i in range(3):
        total += _leaf(i)
    return len([total])


def test_counts_python_and_c_calls_and_is_repeatable():
    ops, py, c, per = count(_caller, by_function=True)
    assert py == 4  # _caller and three _leaf calls
    assert c >= 2  # range() and len() at least (3.12 also sees the list's construction helpers)
    assert ops > 0 and per and sum(per.values()) == ops
    assert any(k.endswith(":_leaf") for k in per) and any(k.endswith(":_caller") for k in per)
    assert count(_caller)[:3] == (ops, py, c)  # the same on every run


def test_more_work_counts_more_bytecodes():
    def loop(n):
        return lambda: [_leaf(i) for i in range(n)]

    small, large = count(loop(10))[0], count(loop(100))[0]
    assert large > 5 * small


def test_by_backend_call_charges_a_backend_method_with_everything_under_it():
    import numpy as np

    import flowgraph as fg

    be = fg.get_backend("cpu")
    x, w = np.ones((4, 8), np.float32), np.ones(8, np.float32)

    def step():
        total = 0
        for _ in range(2):
            total += 1
        be.layer_norm(x, w, w, 1e-5)  # a Python method of the NumPy backend, calling helpers of its own
        return total

    ops, _, _, per = count(step, by_backend_call=True)
    assert sum(per.values()) == ops
    assert per["backend:layer_norm"] > 0 and not any(k.startswith("backend:") and k != "backend:layer_norm"
                                                       for k in per)
    assert any(k.endswith(":step") for k in per)  # the caller's own bytecodes stay its own
    # everything the call ran (the backend's helpers and NumPy's Python wrappers) is the call's: what is left
    # outside is the caller's own code (and on 3.12 the counter's own lines), as counted per function
    by_function = count(step, by_function=True)[3]
    outside = {k: n for k, n in per.items() if not k.startswith("backend:")}
    assert all(k.endswith(":step") or "host_cost.py:" in k for k in outside)
    assert all(by_function[k] == n for k, n in outside.items())
