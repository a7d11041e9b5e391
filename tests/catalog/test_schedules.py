"""Schedule windows: inside/outside, across midnight, at exact edges, on DST change days,
and overlap validation."""

from __future__ import annotations

from datetime import datetime, time, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest
from django.core.exceptions import ValidationError

from catalog.models import ScheduleWindow
from catalog.schedules import Window, active_window, overlapping, parse_weekdays
from fleet.planning.planner import ModelView, Policy, ProfileView, desired_replicas

NY = "America/New_York"
OFFICE = Window(parse_weekdays("mon-fri"), time(9), time(17), 3, 5, id=1)
NIGHT = Window(parse_weekdays("fri"), time(22), time(6), 2, None, id=2)


def local(tz: str, *args, fold=0) -> datetime:
    return datetime(*args, tzinfo=ZoneInfo(tz), fold=fold).astimezone(timezone.utc)


def test_weekday_shorthands():
    assert parse_weekdays("mon-fri") == (0, 1, 2, 3, 4)
    assert parse_weekdays("daily") == tuple(range(7))
    assert parse_weekdays("sat,sun") == parse_weekdays("weekends") == (5, 6)
    assert parse_weekdays("fri-mon") == (0, 4, 5, 6)
    with pytest.raises(ValueError, match="funday"):
        parse_weekdays("funday")


def test_inside_and_outside_office_hours():
    assert active_window([OFFICE], local("UTC", 2026, 12, 1, 12), "UTC") == OFFICE  # a Tuesday
    assert active_window([OFFICE], local("UTC", 2026, 12, 5, 12), "UTC") is None  # Saturday
    assert active_window([OFFICE], local("UTC", 2026, 12, 1, 20), "UTC") is None


def test_exact_edges_start_inclusive_end_exclusive():
    assert active_window([OFFICE], local("UTC", 2026, 12, 1, 9, 0, 0), "UTC") == OFFICE
    assert active_window([OFFICE], local("UTC", 2026, 12, 1, 8, 59, 59), "UTC") is None
    assert active_window([OFFICE], local("UTC", 2026, 12, 1, 16, 59, 59), "UTC") == OFFICE
    assert active_window([OFFICE], local("UTC", 2026, 12, 1, 17, 0, 0), "UTC") is None


def test_a_window_across_midnight_runs_into_the_next_day():
    assert active_window([NIGHT], local("UTC", 2026, 12, 4, 23), "UTC") == NIGHT  # Friday night
    assert active_window([NIGHT], local("UTC", 2026, 12, 5, 5, 59), "UTC") == NIGHT  # Saturday early
    assert active_window([NIGHT], local("UTC", 2026, 12, 5, 6), "UTC") is None
    assert active_window([NIGHT], local("UTC", 2026, 12, 5, 23), "UTC") is None  # Saturday night: not listed
    assert active_window([NIGHT], local("UTC", 2026, 12, 4, 3), "UTC") is None  # Friday early: Thursday not listed


def test_the_cluster_time_zone_is_used():
    # 9:00 in New York is 14:00 UTC in winter.
    assert active_window([OFFICE], local(NY, 2026, 12, 1, 9, 30), NY) == OFFICE
    assert active_window([OFFICE], local("UTC", 2026, 12, 1, 9, 30), NY) is None


def test_a_window_starting_in_the_skipped_hour_begins_when_the_clock_jumps():
    # 2027-03-14: New York skips 02:00-03:00.
    early = Window((6,), time(2, 30), time(5), 1, id=3)
    assert active_window([early], local(NY, 2027, 3, 14, 1, 59, 59), NY) is None
    jump = datetime(2027, 3, 14, 7, 0, tzinfo=timezone.utc)  # 03:00 EDT, the first valid instant
    assert active_window([early], jump, NY) == early
    assert active_window([early], jump - timedelta(seconds=1), NY) is None


def test_in_the_repeated_hour_the_first_occurrence_counts():
    # 2026-11-01: New York repeats 01:00-02:00.
    ends = Window((6,), time(0), time(1, 30), 1, id=4)
    starts = Window((6,), time(1, 30), time(4), 1, id=5)
    first_0115 = local(NY, 2026, 11, 1, 1, 15, fold=0)
    second_0115 = local(NY, 2026, 11, 1, 1, 15, fold=1)
    first_0145 = local(NY, 2026, 11, 1, 1, 45, fold=0)
    assert active_window([ends], first_0115, NY) == ends
    assert active_window([ends], second_0115, NY) is None  # ended at the first 01:30
    assert active_window([starts], first_0145, NY) == starts
    assert active_window([starts], second_0115, NY) == starts  # started at the first 01:30


def test_inside_a_window_its_min_and_max_apply_outside_the_models_own():
    m = ModelView(1, "m", ProfileView(1, cpu_cores=1), min_replicas=1, max_replicas=2, window_min=3,
                  window_max=5, extra_replicas=4)
    now = datetime(2026, 12, 1, tzinfo=timezone.utc)
    assert desired_replicas(m, Policy(), now) == 5
    assert desired_replicas(ModelView(1, "m", None, min_replicas=1, max_replicas=2, extra_replicas=4), Policy(), now) == 2


def test_overlap_detection():
    assert overlapping([OFFICE, NIGHT]) == []
    lunch = Window((1,), time(12), time(13), 4, id=6)
    assert overlapping([OFFICE, lunch]) == [(OFFICE, lunch)]
    sunday_late = Window((6,), time(23), time(2), 1, id=7)
    monday_early = Window((0,), time(1), time(3), 1, id=8)
    assert overlapping([sunday_late, monday_early]) == [(sunday_late, monday_early)]  # across the week's end


@pytest.mark.django_db
def test_overlapping_windows_are_rejected_with_a_validation_message(make_model):
    m = make_model("m")
    ScheduleWindow.objects.create(model=m, weekdays="mon-fri", start=time(9), end=time(17), min_replicas=2)
    clash = ScheduleWindow(model=m, weekdays="wed", start=time(16), end=time(18), min_replicas=1)
    with pytest.raises(ValidationError) as exc:
        clash.full_clean()
    assert "Overlaps the window mon,tue,wed,thu,fri 09:00–17:00" in str(exc.value)
    with pytest.raises(ValidationError, match="not a day"):
        ScheduleWindow(model=m, weekdays="someday", start=time(1), end=time(2)).full_clean()


# --- the next start, for pre-warm (issue 18) ---------------------------------------------------

def test_the_next_start_is_the_first_window_start_after_now_in_the_clusters_zone():
    from catalog.schedules import next_start

    friday_evening = local(NY, 2026, 12, 4, 18, 0)
    start, window = next_start([OFFICE, NIGHT], friday_evening, NY)
    assert window == NIGHT and start == local(NY, 2026, 12, 4, 22, 0)
    start, window = next_start([OFFICE], friday_evening, NY)  # over the weekend to Monday
    assert window == OFFICE and start == local(NY, 2026, 12, 7, 9, 0)
    assert next_start([OFFICE], friday_evening, NY, within=timedelta(days=1)) is None
    at_start = local(NY, 2026, 12, 7, 9, 0)
    assert next_start([OFFICE], at_start, NY)[0] == local(NY, 2026, 12, 8, 9, 0)  # after now, not at


def test_a_start_in_the_skipped_hour_is_when_the_clock_jumps_so_pre_warm_agrees_with_the_window():
    from catalog.schedules import next_start

    early = Window((6,), time(2, 30), time(5), 1, id=3)
    start, _ = next_start([early], local(NY, 2027, 3, 14, 0, 0), NY)
    assert start == datetime(2027, 3, 14, 7, 0, tzinfo=timezone.utc)  # 03:00 EDT
    assert active_window([early], start, NY) == early
    assert active_window([early], start - timedelta(seconds=1), NY) is None


def test_in_the_repeated_hour_the_next_start_is_the_first_occurrence_and_midnight_is_crossed():
    from catalog.schedules import next_start

    starts = Window((6,), time(1, 30), time(4), 1, id=5)
    start, _ = next_start([starts], local(NY, 2026, 11, 1, 0, 0), NY)
    assert start == local(NY, 2026, 11, 1, 1, 30, fold=0)
    start, window = next_start([NIGHT], local(NY, 2026, 12, 4, 23, 0), NY)  # inside Friday's night window
    assert window == NIGHT and start == local(NY, 2026, 12, 11, 22, 0)
