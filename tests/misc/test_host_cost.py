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
