"""Printing sizes and durations (dstore.runtime.units): rounded first, then the unit chosen, so a figure never
shows a mantissa of 1000 or a fourth digit; and the Hypothesis profile the tests run under."""

import math
import os
import re
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dstore.runtime.units import fmt_rate, fmt_seconds, fmt_size, parse_duration, parse_size

# values next to every boundary where rounding to three digits changes the unit or the decimals
_EDGES = [m * 10.0**e for e in range(-12, 19) for m in (0.99949, 0.9995, 0.99951, 0.9996, 0.99999, 1.0)]


def test_figures_that_round_up_take_the_next_unit_or_decimal():
    assert fmt_seconds(0.9996) == "1.00 s"  # was "1e+03 ms"
    assert fmt_size(9996) == "10.0 kB"  # was "10.00 kB"
    assert fmt_size(99_960) == "100 kB" and fmt_size(999.6) == "1.00 kB" and fmt_size(999.4) == "999 B"
    assert fmt_seconds(0.0009996) == "1.00 ms" and fmt_seconds(599.9) == "10.0 min"
    assert fmt_seconds(9.996) == "10.0 s" and fmt_rate(99_960e6) == "100 GB/s"
    assert fmt_size(-9996) == "-10.0 kB" and fmt_seconds(5e-7) == "500 ns" and fmt_seconds(36_000) == "10.0 h"
    assert fmt_size(9.9996e17) == "1000 PB" and fmt_size(2.5e18) == "2500 PB"  # past the last unit: whole PB


def _three_significant(mantissa: str) -> bool:
    return len(mantissa.replace(".", "")) == 3 and mantissa[0] != "0"


@settings(max_examples=400)
@given(
    st.one_of(st.floats(0, 9.99e17), st.integers(0, 999 * 10**15), st.sampled_from([x for x in _EDGES if x < 9.99e17]))
)
def test_a_size_is_three_digits_in_the_largest_unit_below_it_and_reads_back(n):
    text = fmt_size(n)
    mantissa, unit = text.split(" ")
    if unit == "B":
        assert mantissa.isdigit() and int(mantissa) == round(n) < 1000
        return  # whole bytes: checked
    assert _three_significant(mantissa) and 1 <= float(mantissa) < 1000, text
    back = parse_size(text)  # the project's own reader of sizes
    assert abs(back - n) <= 0.005 * n + 1, (n, text, back)


@settings(max_examples=400)
@given(st.one_of(st.floats(1e-9, 3.5e6), st.sampled_from([x for x in _EDGES if 1e-9 <= x < 3.5e6])))
def test_a_duration_is_three_digits_in_the_largest_unit_below_it_and_reads_back(s):
    text = fmt_seconds(s)
    mantissa, unit = text.split(" ")
    assert _three_significant(mantissa), text
    limit = {"ns": 1000, "us": 1000, "ms": 1000, "s": 600, "min": 600, "h": 1000}[unit]
    assert 1 <= float(mantissa) < limit, text
    back = parse_duration(text)  # the project's own reader of durations
    assert math.isclose(back, s, rel_tol=0.0051), (s, text, back)


def test_the_tests_run_under_the_ci_hypothesis_profile():
    # loaded by tests/conftest.py unless $HYPOTHESIS_PROFILE names another
    if os.environ.get("HYPOTHESIS_PROFILE", "ci") != "ci":
        pytest.skip("another Hypothesis profile was asked for")
    assert settings.default is not None and settings.default.deadline is None


@settings(max_examples=2)
@given(st.integers(0, 1))
def test_an_example_slower_than_hypothesis_default_deadline_does_not_fail(x):
    # 300 ms, as a loaded machine can make an example: Hypothesis's 200 ms deadline would fail it
    time.sleep(0.3)
    assert re.fullmatch(r"[01]", str(x))


def test_a_size_past_a_floats_range_is_refused_naming_it():
    from dstore.errors import ConfigError

    with pytest.raises(ConfigError, match=r"--x='1e400' is too large"):
        parse_size("1e400", "--x")  # was an OverflowError traceback
    assert parse_size("1.5PB") == 1_500_000_000_000_000
