"""Warm before demand's pure rules (fleet.planning.warmth): cold-start estimates, the lead,
a window brought forward, arrival profiles and predictions. No database; the clock is the
``now`` each test passes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from fleet.planning import warmth
from fleet.planning.warmth import ArrivalProfile, ColdStart, UpcomingWindow

UTC_ZONE = ZoneInfo("UTC")
MONDAY = datetime(2026, 11, 30, 0, 0, tzinfo=UTC)  # a Monday, midnight UTC


def at(days=0.0, hours=0.0, minutes=0.0) -> datetime:
    return MONDAY + timedelta(days=days, hours=hours, minutes=minutes)


# --- Cold starts ----------------------------------------------------------------------------


def test_the_estimate_is_the_90th_percentile_of_the_last_twenty_starts_newest_first():
    starts = [60.0] * 18 + [300.0, 300.0] + [999.0] * 5  # newest first: the 999s are older than the last 20
    estimate = warmth.cold_start(starts, default_s=120)
    assert estimate.samples == 20 and estimate.measured
    assert estimate.estimate_s == pytest.approx(warmth.quantile([60.0] * 18 + [300.0, 300.0], 0.9))
    assert 60 < estimate.estimate_s < 300  # one slow start moves it, it does not run away
    assert estimate.words().startswith("about ") and "p90 of 20 starts" in estimate.words()


def test_without_measurements_the_default_stands_in_and_says_so():
    estimate = warmth.cold_start([], default_s=120)
    assert estimate == ColdStart(120.0, 0) and not estimate.measured
    assert "not measured yet" in estimate.words()
    assert warmth.cold_start([float("nan"), -5.0], default_s=90).samples == 0


def test_the_lead_is_the_estimate_plus_a_quarter_and_at_least_twenty_seconds():
    assert warmth.lead_s(ColdStart(200.0, 5)) == 250.0
    assert warmth.lead_s(ColdStart(30.0, 5)) == 50.0


def test_quantile_interpolates_like_numpy_and_refuses_nothing():
    import numpy as np

    values = [3.0, 1.0, 7.0, 4.0, 10.0]
    for q in (0.0, 0.25, 0.5, 0.9, 1.0):
        assert warmth.quantile(values, q) == pytest.approx(float(np.quantile(values, q)))
    with pytest.raises(ValueError):
        warmth.quantile([], 0.5)


# --- A window brought forward ---------------------------------------------------------------


UPCOMING = UpcomingWindow(at(hours=8), min_replicas=2, max_replicas=4, label="mon-fri 08:00–19:00 (min 2, max 4)")
START = ColdStart(150.0, 12)  # lead 187.5 s


def test_a_window_is_brought_forward_by_its_lead_and_no_earlier():
    lead = warmth.lead_s(START)
    assert warmth.window_ahead(UPCOMING, 1, 3, 3, START, at(hours=8) - timedelta(seconds=lead + 1)) is None
    ahead = warmth.window_ahead(UPCOMING, 1, 3, 3, START, at(hours=8) - timedelta(seconds=lead))
    assert ahead is not None and (ahead.min_replicas, ahead.max_replicas) == (2, 4)
    assert ahead.since == at(hours=8) - timedelta(seconds=lead)
    assert "pre-warm: window mon-fri 08:00–19:00" in ahead.words and "p90 of 12 starts" in ahead.words
    # From its start the window itself is in force: nothing is brought forward any more.
    assert warmth.window_ahead(UPCOMING, 1, 3, 3, START, at(hours=8)) is None


def test_only_a_rise_is_brought_forward_and_a_ceiling_already_higher_stays():
    lower = UpcomingWindow(at(hours=8), min_replicas=1, max_replicas=None, label="night")
    assert warmth.window_ahead(lower, 2, 5, 5, START, at(hours=8, minutes=-1)) is None
    ahead = warmth.window_ahead(UPCOMING, 1, 6, 6, START, at(hours=8, minutes=-1))
    assert ahead.max_replicas == 6  # load had scaled to 6: the window's max of 4 does not cap it early


# --- Arrival profiles -----------------------------------------------------------------------


def weekly(hours_of_week: list[int], weeks: int) -> list[datetime]:
    return [at(days=7 * w) + timedelta(hours=h, minutes=20) for w in range(weeks) for h in hours_of_week]


def test_an_hour_asked_for_four_weeks_running_is_likely_three_are_not_yet():
    nine = 9  # Monday 09:00–10:00
    three = warmth.learn(ArrivalProfile(), weekly([nine], 3), at(days=21), UTC_ZONE)
    four = warmth.learn(ArrivalProfile(), weekly([nine], 4), at(days=28), UTC_ZONE)
    assert not warmth.likely(three, nine) and warmth.likely(four, nine)
    assert not warmth.likely(four, nine + 1) and not warmth.likely(four, 24 + nine)  # Tuesday was never asked
    assert four.share(nine) == pytest.approx((1 + 0.7 + 0.49 + 0.343) / (1 + 0.7 + 0.49 + 0.343 + 1))


def test_a_habit_fades_when_the_hour_goes_unasked():
    profile = warmth.learn(ArrivalProfile(), weekly([9], 6), at(days=42), UTC_ZONE)
    assert warmth.likely(profile, 9)
    later = warmth.observe(profile, at(days=56), None, UTC_ZONE)  # two more weeks, never asked
    assert not warmth.likely(later, 9)


def test_observe_closes_the_hours_that_ended_and_credits_the_latest_request():
    p = warmth.observe(ArrivalProfile(), at(hours=9, minutes=5), at(hours=9, minutes=1), UTC_ZONE)
    assert p.open_hour == warmth.epoch_hour(at(hours=9)) and p.open_asked and p.empty
    assert warmth.observe(p, at(hours=9, minutes=30), at(hours=9, minutes=1), UTC_ZONE) is p  # nothing moved
    p = warmth.observe(p, at(hours=12, minutes=1), at(hours=10, minutes=30), UTC_ZONE)
    assert (p.asked[9], p.asked[10], p.asked[11]) == (1.0, 1.0, 0.0)
    assert (p.seen[9], p.seen[10], p.seen[11], p.seen[12]) == (1.0, 1.0, 1.0, 0.0)
    assert not p.open_asked


def test_a_long_gap_closes_a_week_at_most():
    p = warmth.observe(ArrivalProfile(), at(), None, UTC_ZONE)
    p = warmth.observe(p, at(days=60), None, UTC_ZONE)
    assert all(s == 1.0 for s in p.seen)


def test_hours_of_the_week_are_local_and_follow_daylight_saving():
    berlin = ZoneInfo("Europe/Berlin")
    summer = datetime(2026, 6, 29, 7, 30, tzinfo=UTC)  # Monday 09:30 in Berlin (UTC+2)
    winter = datetime(2026, 11, 30, 8, 30, tzinfo=UTC)  # Monday 09:30 in Berlin (UTC+1)
    for when in (summer, winter):
        assert warmth.slot_of(warmth.epoch_hour(when), berlin) == 9


def test_a_stored_profile_survives_json_and_a_damaged_one_is_empty():
    profile = warmth.learn(ArrivalProfile(), weekly([9, 10], 4), at(days=28), UTC_ZONE)
    assert ArrivalProfile.from_json(profile.as_json()).share(9) == pytest.approx(profile.share(9), abs=1e-3)
    for bad in (None, "x", {"asked": [1] * 3, "seen": [1] * 3}, {"asked": ["x"] * 168, "seen": [0] * 168},
                {"asked": [float("inf")] * 168, "seen": [1] * 168}):
        assert ArrivalProfile.from_json(bad).empty


# --- Predictions ----------------------------------------------------------------------------


def habit(hours: list[int], days=range(5), weeks=4) -> ArrivalProfile:
    asked = [at(days=7 * w + d, hours=h, minutes=10) for w in range(weeks) for d in days for h in hours]
    return warmth.learn(ArrivalProfile(), asked, at(days=7 * weeks), UTC_ZONE)


def test_a_model_usually_asked_for_at_nine_is_warm_from_the_lead_before_until_the_idle_timeout_after():
    profile = habit([9])  # weekdays 09–10
    week5 = 28  # the Monday after four weeks
    lead, idle = 200.0, 900.0
    before = at(days=week5, hours=9) - timedelta(seconds=lead + 1)
    assert warmth.predict(profile, before, UTC_ZONE, lead, idle) is None
    found = warmth.predict(profile, before + timedelta(seconds=2), UTC_ZONE, lead, idle)
    assert found is not None
    assert found.warm_from == at(days=week5, hours=9) - timedelta(seconds=lead)
    assert found.run_end == at(days=week5, hours=10) and found.until == at(days=week5, hours=10, minutes=15)
    assert found.words == "usually asked for on weekdays 09–10; warm until 10:15"
    assert warmth.predict(profile, at(days=week5, hours=10, minutes=14), UTC_ZONE, lead, idle) is not None
    assert warmth.predict(profile, at(days=week5, hours=10, minutes=16), UTC_ZONE, lead, idle) is None
    # Saturdays were never asked for.
    assert warmth.predict(profile, at(days=week5 + 5, hours=9, minutes=30), UTC_ZONE, lead, idle) is None


def test_consecutive_likely_hours_are_one_run_and_the_words_name_the_days():
    profile = habit([9, 10, 11], days=[0])  # Mondays 09–12
    found = warmth.predict(profile, at(days=28, hours=10), UTC_ZONE, 60.0, 600.0)
    assert found.run_end == at(days=28, hours=12)
    assert found.words.startswith("usually asked for on Mondays 09–12")
    assert warmth.describe_profile(profile) == "Mondays 09–12"
    assert warmth.describe_profile(habit([9])) == "weekdays 09–10"
    assert warmth.describe_profile(ArrivalProfile()) == ""


def test_an_empty_or_missing_profile_predicts_nothing():
    assert warmth.predict(None, at(), UTC_ZONE, 60, 600) is None
    assert warmth.predict(ArrivalProfile(), at(), UTC_ZONE, 60, 600) is None


def test_in_a_zone_half_an_hour_off_utc_the_words_name_the_same_hours_as_the_profile():
    kolkata = ZoneInfo("Asia/Kolkata")
    # 04:40 UTC is 10:10 in Kolkata: the slot read at the hour's middle (04:30 UTC = 10:00 local).
    asked = [at(days=7 * w + d, hours=4, minutes=40) for w in range(4) for d in range(5)]
    profile = warmth.learn(ArrivalProfile(), asked, at(days=28), kolkata)
    assert warmth.describe_profile(profile) == "weekdays 10–11"
    found = warmth.predict(profile, at(days=28, hours=4, minutes=40), kolkata, 60.0, 600.0)
    assert found.words.startswith("usually asked for on weekdays 10–11")


def test_a_stored_open_hour_in_the_future_does_not_stop_the_profile_learning():
    stuck = ArrivalProfile(open_hour=warmth.epoch_hour(at(days=30)))
    seen = warmth.observe(stuck, at(hours=9, minutes=5), at(hours=9, minutes=1), UTC_ZONE)
    assert seen.open_hour == warmth.epoch_hour(at(hours=9)) and seen.open_asked


def test_a_model_asked_at_every_hour_is_warm_around_the_clock():
    always = warmth.learn(ArrivalProfile(), [at(hours=h) for h in range(0, 24 * 35)], at(days=35), UTC_ZONE)
    found = warmth.predict(always, at(days=35, hours=3), UTC_ZONE, 60.0, 600.0)
    assert found.words.startswith("usually asked for every day around the clock")
