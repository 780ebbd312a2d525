"""Epoch numbers as timestamps: seconds, milliseconds, microseconds or nanoseconds, read the
same way by ``parse_ts`` and the recorder over the whole range a datetime holds (years 1-9999),
and a clear error beyond it."""

from __future__ import annotations

import math

import pytest

from hindsight_loop import Hindsight
from hindsight_loop.ingest.wire import timestamp_ns
from hindsight_loop.models import iso, parse_ts

FIRST = -62_135_596_800  # 0001-01-01T00:00:00Z in epoch seconds
END = 253_402_300_800  # just past 9999-12-31T23:59:59.999999Z
NOW = 1_732_084_333  # 2024-11-20T06:32:13Z

READINGS = [
    # The last instant of the year 9999 in every unit (milliseconds were read as 1978).
    (END - 1, "9999-12-31T23:59:59.000Z"),
    (END * 10**3 - 1, "9999-12-31T23:59:59.999Z"),
    (END * 10**6 - 1, "9999-12-31T23:59:59.999Z"),
    (END * 10**9 - 1, "9999-12-31T23:59:59.999Z"),
    # The first instant of the year 1 in every unit.
    (FIRST, "0001-01-01T00:00:00.000Z"),
    (FIRST * 10**3, "0001-01-01T00:00:00.000Z"),
    (FIRST * 10**6, "0001-01-01T00:00:00.000Z"),
    (FIRST * 10**9, "0001-01-01T00:00:00.000Z"),
    # Now, in every unit.
    (NOW, "2024-11-20T06:32:13.000Z"),
    (NOW * 10**3 + 7, "2024-11-20T06:32:13.007Z"),
    (NOW * 10**6 + 7_123, "2024-11-20T06:32:13.007Z"),
    (NOW * 10**9 + 7_123_456, "2024-11-20T06:32:13.007Z"),
    # Where one unit ends the next begins: the seconds of the year 5138 stay seconds, and the
    # first number past them is a millisecond of 1978.
    (10**11, "5138-11-16T09:46:40.000Z"),
    (END, "1978-01-11T21:31:40.800Z"),
    (END * 10**3, "1978-01-11T21:31:40.800Z"),
    (END * 10**6, "1978-01-11T21:31:40.800Z"),
    (FIRST - 1, "1968-01-12T20:06:43.199Z"),
    (0, "1970-01-01T00:00:00.000Z"),
    (-1, "1969-12-31T23:59:59.000Z"),
    # Floats: the decimal written, to the microsecond (1.001 is stored as 1.000999…).
    (NOW + 0.001, "2024-11-20T06:32:13.001Z"),
    (float(NOW * 10**3) + 0.5, "2024-11-20T06:32:13.000Z"),
    (float(END * 10**3 - 1), "9999-12-31T23:59:59.999Z"),
]


@pytest.mark.parametrize(("value", "expected"), READINGS)
def test_an_epoch_number_reads_in_the_coarsest_unit_that_fits(value: float, expected: str) -> None:
    assert iso(parse_ts(value)) == expected


@pytest.mark.parametrize(
    "value",
    [END * 10**9, FIRST * 10**9 - 1, 10**30, -(10**30), 1e300, -1e300],
)
def test_a_number_out_of_range_in_every_unit_is_a_clear_error(value: float) -> None:
    with pytest.raises(ValueError, match=r"out of range.*years 1-9999.*ISO-8601"):
        parse_ts(value)
    assert timestamp_ns(value) is None  # an import reads it as no time, not a wrong one


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_nan_and_infinity_are_clear_errors(value: float) -> None:
    with pytest.raises(ValueError, match="finite number"):
        parse_ts(value)


def test_the_recorder_reads_epoch_numbers_as_parse_ts_does(hs: Hindsight) -> None:
    # Left out: nanoseconds past 2262, which do not fit the 64 bits an event crosses to the
    # writer process in (it warns and keeps the original), and 0, which the recorder takes as
    # no time given.
    values = [v for v, _ in READINGS if isinstance(v, int) and 0 < abs(v) < 2**63]
    # Integers the recorder takes as nanoseconds without asking parse_ts: its band's edges.
    values += [END * 10**6 - 1, END * 10**6, 2 * 10**17]
    for i, value in enumerate(values):
        hs.record(
            {"type": "task_start", "task_id": f"tsk_{i}", "task_type": "t", "timestamp": value}
        )
    hs.flush()
    for i, value in enumerate(values):
        [event] = hs.store.events(f"tsk_{i}")
        assert event.timestamp == iso(parse_ts(value)), value


def test_an_import_reads_the_last_millisecond_of_9999() -> None:
    assert timestamp_ns(END * 10**3 - 1) == (END - 1) * 10**9 + 999_000_000


@pytest.mark.parametrize(
    ("value", "ns"),
    [
        ("1969-12-31T23:59:59.500000Z", -500_000_000),  # was +500_000_000: a second off
        ("1969-12-31T23:59:59Z", -1_000_000_000),
        ("1970-01-01T00:00:00.000001Z", 1_000),
        (-0.25, -250_000_000),
    ],
)
def test_an_import_reads_a_time_before_1970_to_the_microsecond(value: object, ns: int) -> None:
    assert timestamp_ns(value) == ns
