"""GPU counts: whole, non-negative numbers in any Kubernetes notation; everything else says why not."""

import pytest

from webhook.quantity import QuantityError, gpu_count


@pytest.mark.parametrize(
    ("value", "count"),
    [(1, 1), ("1", 1), ("2", 2), ("1000m", 1), ("0", 0), (0, 0), ("+3", 3), ("1e1", 10), ("1k", 1000), (2.0, 2)],
)
def test_whole_numbers_in_any_notation(value, count):
    assert gpu_count(value) == count


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("500m", "not a whole number"),
        ("1.5", "not a whole number"),
        (0.5, "not a whole number"),
        ("1Ki", None),  # 1024 is whole; listed to show binary suffixes parse
        ("-1", "negative"),
        (-2, "negative"),
        ("two", "not a quantity"),
        ("", "not a quantity"),
        (" 1", "not a quantity"),
        ("1_000", "not a quantity"),
        ("NaN", "not a quantity"),
        ("Infinity", "not a quantity"),
        (True, "not a quantity"),
        (None, "not a quantity"),
        ([1], "not a quantity"),
        ("1ki", "not a quantity"),
    ],
)
def test_everything_else_is_refused_with_a_reason(value, reason):
    if reason is None:
        assert gpu_count(value) == 1024
        return
    with pytest.raises(QuantityError, match=reason):
        gpu_count(value)
