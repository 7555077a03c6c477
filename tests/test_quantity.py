"""GPU counts: whole, non-negative numbers in any Kubernetes notation; everything else says why not."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from webhook.core.quantity import QuantityError, gpu_count

CEILING = 10**6  # the most GPUs of one kind a count may ask for


@pytest.mark.parametrize(
    ("value", "count"),
    [(1, 1), ("1", 1), ("2", 2), ("1000m", 1), ("0", 0), (0, 0), ("+3", 3), ("1e1", 10), ("1k", 1000), (2.0, 2),
     ("1M", CEILING), (CEILING, CEILING), ("1e6", CEILING), ("0e64", 0), ("100e-2", 1)],
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
        ("١", "not a quantity"),  # an Arabic-Indic digit one: Decimal reads it, the apiserver does not
        ("0.0010000000000000000000000000001k", "not a whole number"),  # was rounded to 1 at 28 digits
    ],
)
def test_everything_else_is_refused_with_a_reason(value, reason):
    if reason is None:
        assert gpu_count(value) == 1024
        return
    with pytest.raises(QuantityError, match=reason):
        gpu_count(value)


NOT_SENSIBLE = "is not a sensible GPU count (at most 1000000)"


@pytest.mark.parametrize(
    "value",
    [
        "1000001", 1000001, "1001k", "1Ei", "8Ei", "1E", "1e7", 1e7, 1e300,
        "1e400",  # an exponent the grammar allows but no count needs
        "1e5000",  # its int has 5001 digits: str() of it raised ValueError, an internal error
        "1e600000",  # int(Decimal(...)) held a worker for about 20 s
        "1e1000000",  # and this for more than 30 s
        "1e-65",  # exponents are bounded both ways, so the cost is the same for every input
        "1" * 65,  # so are digit strings
        10**5000,  # a JSON integer with thousands of digits
    ],
    ids=lambda v: f"int of {len(str(v // 10**4000)) + 4000} digits" if isinstance(v, int) and v > 10**4000
    else repr(v)[:24],
)
def test_absurd_counts_are_refused_before_conversion(value):
    with pytest.raises(QuantityError, match="not a sensible GPU count") as caught:
        gpu_count(value)
    assert str(caught.value).endswith(NOT_SENSIBLE)
    assert len(str(caught.value)) < 120  # a long value is cut short, not echoed back whole


def test_the_message_says_what_was_written():
    with pytest.raises(QuantityError) as caught:
        gpu_count("1Ei")
    assert str(caught.value) == f'"1Ei" {NOT_SENSIBLE}'
    with pytest.raises(QuantityError) as caught:
        gpu_count("9" * 70_000)
    assert str(caught.value) == f'"9999999999999999…" (70000 characters) {NOT_SENSIBLE}'


PLACEHOLDER = "is a placeholder that was never substituted; render the manifest first"


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("${GPUS}", f'"${{GPUS}}" {PLACEHOLDER}'),  # envsubst
        ("${GPUS:-1}", f'"${{GPUS:-1}}" {PLACEHOLDER}'),
        ("$GPUS", f'"$GPUS" {PLACEHOLDER}'),
        ("{{ .Values.gpus }}", f'"{{{{ .Values.gpus }}}}" {PLACEHOLDER}'),  # a Helm template never rendered
        ("${GPUS}x", '"${GPUS}x" is not a quantity'),  # a placeholder with more around it is just not a quantity
        ("$1", '"$1" is not a quantity'),
        ("$", '"$" is not a quantity'),
        # too long to be a count at all: the length is refused first, as for any string
        ("${" + "G" * 70 + "}", f'"${{GGGGGGGGGGGGGG…" (73 characters) {NOT_SENSIBLE}'),
    ],
    ids=repr,
)
def test_a_placeholder_never_substituted_says_so(value, message):
    with pytest.raises(QuantityError) as caught:
        gpu_count(value)
    assert str(caught.value) == message


# Every parse returns a count within the ceiling or refuses, and does so quickly whatever the input's size:
# the deadline bounds each example's time (200 ms, against tens of seconds for "1e600000" before the bound).
quick = settings(deadline=200, max_examples=300, database=None)
digits = st.text(alphabet="0123456789", min_size=1, max_size=5000)
exponents = st.one_of(st.integers(-80, 80), st.integers(-(10**7), 10**7), st.integers(-(10**70), 10**70))
suffixes = st.sampled_from(["", "m", "k", "M", "G", "E", "Ki", "Ei", "n", "u"])


def returns_or_refuses(value):
    try:
        count = gpu_count(value)
    except QuantityError as exc:
        assert len(str(exc)) < 200
        return
    assert 0 <= count <= CEILING


@quick
@given(st.sampled_from(["", "+", "-"]), digits, st.sampled_from(["", "."]), st.text("0123456789", max_size=50),
       exponents)
def test_any_exponent_costs_the_same(sign, whole, dot, fraction, exponent):
    returns_or_refuses(f"{sign}{whole}{dot}{fraction}e{exponent}")


@quick
@given(digits, suffixes)
def test_any_length_of_digits_costs_the_same(number, suffix):
    returns_or_refuses(number + suffix)


@quick
@given(st.one_of(st.integers(-(10**4000), 10**4000), st.floats(allow_nan=True, allow_infinity=True)))
def test_any_json_number_costs_the_same(number):
    returns_or_refuses(number)
