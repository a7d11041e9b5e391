"""The admin's charts (``fleet.ops.charts``, ``/admin/dashboard/charts/``): the pure parts
(periods, buckets, top series, p95, labels), the figures from stored usage records and GPU
samples, the page and its JSON through Django's test client (staff with the permissions
only), the vendored Chart.js served by the real ASGI app, and the page in headless Chromium
with seeded data (screenshots under test-artifacts/, the README's pictures among them)."""

from __future__ import annotations

import math
import random
import zoneinfo
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from django.contrib.auth.models import Permission
from django.utils import timezone

from catalog.models import ClusterSettings
from fleet.models import Agent, GpuSample
from fleet.ops import charts
from gateway.models import ApiKey, Team, UsageRecord
from tests.ops.test_dashboard import ARTIFACTS, browser, busy, log_in, wait_for  # noqa: F401

#: A fixed "now" for the figures: 2026-12-04 12:34:56 UTC.
NOW = datetime(2026, 12, 4, 12, 34, 56, tzinfo=UTC)


# --- Pure parts ---------------------------------------------------------------------------------


def test_every_period_has_between_60_and_120_points():
    assert [p.key for p in charts.PERIODS] == ["1h", "6h", "24h", "7d", "30d"]
    for p in charts.PERIODS:
        assert 60 <= p.points <= 120 and p.points * p.bucket_s == p.seconds, p


def test_an_unknown_period_or_grouping_names_the_choices():
    assert charts.period(None).key == "24h" and charts.period("7d").bucket_s == 7200
    with pytest.raises(charts.UnknownChoice, match=r"Unknown period 'week': choose one of 1h, 6h, 24h, 7d, 30d\."):
        charts.period("week")
    assert charts.grouping("") == "model" and charts.grouping("key") == "key"
    assert charts.grouping("team") == "team"
    with pytest.raises(charts.UnknownChoice, match="choose one of model, key, team"):
        charts.grouping("agent")


def test_the_window_ends_with_the_bucket_now_falls_in_and_is_aligned():
    w = charts.window(charts.period("1h"), NOW)
    assert w.points == 60 and w.start == datetime(2026, 12, 4, 11, 35, tzinfo=UTC)
    assert w.end == datetime(2026, 12, 4, 12, 35, tzinfo=UTC) and w.start <= NOW < w.end
    assert w.first_bucket == int(w.start.timestamp()) // 60
    six = charts.window(charts.period("30d"), NOW)
    assert six.start.hour % 6 == 0 and six.start.minute == 0 and six.end == datetime(2026, 12, 4, 18, tzinfo=UTC)


def test_axis_labels_are_in_the_clusters_time_zone():
    p = charts.period("1h")
    labels = charts.axis_labels(charts.window(p, NOW), p.label_format, zoneinfo.ZoneInfo("Asia/Kolkata"))
    assert labels[0] == "17:05" and labels[-1] == "18:04" and len(labels) == 60  # UTC+5:30


def test_top_keeps_the_biggest_with_a_stable_order_on_ties():
    assert charts.top({"a": 1, "b": 5, "c": 5, "d": 3}, 3) == ["b", "c", "d"]
    assert charts.top({None: 2, 7: 2}, 2) == [7, None]  # ties by text: "7" < "None"


def test_p95_is_a_measured_value_by_nearest_rank():
    assert charts.p95([]) is None
    assert charts.p95([42.0]) == 42.0
    assert charts.p95(list(range(1, 101))) == 95
    assert charts.p95(list(range(1, 21))) == 19  # ceil(0.95 * 20) = 19th
    assert charts.p95([5, 1, 3]) == 5


def test_fold_sums_cells_fills_gaps_and_drops_what_falls_outside():
    rows = [(0, 0, 2), (0, 0, 3), (2, 1, 7), (5, 0, 9), (-1, 0, 9), (1, 4, 9), (1, 1, None)]
    assert charts.fold(rows, points=3, count=2) == [[5, 0, 0], [0, 0, 7]]
    assert charts.fold([(1, 0, 4.5)], points=3, count=1, zero=None) == [[None, 4.5, None]]


def test_long_or_hostile_labels_are_cut_on_one_line():
    assert charts.short_label("llama-70b") == "llama-70b"
    hostile = "<script>alert(1)</script>\n" + "x" * 100
    label = charts.short_label(hostile)
    assert len(label) == charts.LABEL_MAX_CHARS and label.endswith("…") and "\n" not in label


# --- Figures from stored rows ---------------------------------------------------------------------


def record(at: datetime, model: str = "llama-70b", key: ApiKey | None = None, ttft_ms: float | None = 100.0,
           prompt: int | None = 10, completion: int | None = 5, status: int = 200,
           team_id: int | None = None) -> UsageRecord:
    team = team_id if team_id is not None else (key.team_id if key is not None else None)
    return UsageRecord(at=at, key=key, team_id=team, model_name=model, replica_id=1, path="/v1/chat/completions",
                       status=status, prompt_tokens=prompt, completion_tokens=completion, ttft_ms=ttft_ms,
                       total_ms=(ttft_ms or 0) + 200)


def series(chart: charts.Chart) -> dict[str, list]:
    return {s.label: s.data for s in chart.series}


@pytest.mark.django_db
def test_requests_tokens_and_ttft_p95_per_model_per_bucket():
    p = charts.period("1h")
    w = charts.window(p, NOW)
    minute = lambda i: w.start + timedelta(seconds=60 * i + 7)
    rows = [record(minute(0), ttft_ms=float(t)) for t in range(1, 21)]  # 20 in the first minute
    rows += [record(minute(0), model="qwen-7b", prompt=None, completion=None, ttft_ms=None, status=503)]
    rows += [record(minute(59), model="qwen-7b", prompt=100, completion=50, ttft_ms=300.0)]
    rows += [record(w.start - timedelta(seconds=1)), record(w.end + timedelta(seconds=1))]  # outside
    UsageRecord.objects.bulk_create(rows)

    requests, tokens, ttft = charts.usage_charts(UsageRecord.objects.all(), p, "model", NOW, UTC)
    assert [s.label for s in requests.series] == ["llama-70b", "qwen-7b"]  # most requests first
    assert len(requests.labels) == 60 and requests.empty is None
    assert series(requests)["llama-70b"][0] == 20 and sum(series(requests)["llama-70b"]) == 20
    assert series(requests)["qwen-7b"][0] == 1 and series(requests)["qwen-7b"][59] == 1
    assert series(tokens)["llama-70b"][0] == 20 * 15 and series(tokens)["qwen-7b"][0] == 0
    assert series(tokens)["qwen-7b"][59] == 150
    assert series(ttft)["llama-70b"][0] == 19.0  # nearest rank of 1..20
    assert series(ttft)["llama-70b"][1] is None  # nothing measured: a gap, not zero
    assert series(ttft)["qwen-7b"][0] is None and series(ttft)["qwen-7b"][59] == 300.0


@pytest.mark.django_db
def test_series_beyond_the_top_are_summed_as_other(monkeypatch):
    monkeypatch.setattr(charts, "TOP_SERIES", 2)
    p = charts.period("6h")
    at = charts.window(p, NOW).start + timedelta(minutes=1)
    rows = [record(at, model=m) for m, n in (("a", 5), ("b", 4), ("c", 2), ("d", 1)) for _ in range(n)]
    UsageRecord.objects.bulk_create(rows)
    requests, tokens, _ = charts.usage_charts(UsageRecord.objects.all(), p, "model", NOW, UTC)
    assert [s.label for s in requests.series] == ["a", "b", "other (2 more)"]
    assert [s.data[0] for s in requests.series] == [5, 4, 3]
    assert [s.data[0] for s in tokens.series] == [75, 60, 45]


@pytest.mark.django_db
def test_per_key_series_name_the_key_and_say_no_key():
    p = charts.period("24h")
    at = charts.window(p, NOW).start + timedelta(minutes=5)
    alice = ApiKey.objects.create(name="alice-batch", prefix="sk-abc123", sha256="a" * 64)
    UsageRecord.objects.bulk_create([record(at, key=alice) for _ in range(3)] + [record(at)])
    requests, _, _ = charts.usage_charts(UsageRecord.objects.all(), p, "key", NOW, UTC)
    assert series(requests) == {"alice-batch (sk-abc123…)": [3] + [0] * 95, "no key": [1] + [0] * 95}


@pytest.mark.django_db
def test_per_team_series_name_the_team_and_say_no_team():
    p = charts.period("24h")
    at = charts.window(p, NOW).start + timedelta(minutes=5)
    research = Team.objects.create(name="research")
    alice = ApiKey.objects.create(name="alice", prefix="sk-abc123", sha256="a" * 64, team=research)
    UsageRecord.objects.bulk_create([record(at, key=alice) for _ in range(3)] + [record(at)] * 2
                                    + [record(at, team_id=9999)])  # a team since deleted
    requests, tokens, _ = charts.usage_charts(UsageRecord.objects.all(), p, "team", NOW, UTC,
                                              teams=Team.objects.all())
    assert requests.title == "Requests per team"
    assert series(requests) == {"research": [3] + [0] * 95, "no team": [2] + [0] * 95,
                                "team #9999 (deleted)": [1] + [0] * 95}
    assert series(tokens)["research"][0] == 45


@pytest.mark.django_db
def test_model_names_outside_the_catalog_are_one_unknown_model_series():
    """A client's invented names (``gpt-4o``, ``nope``: 404 model_not_found) add no series:
    the charts count them as one "unknown model", as /metrics does; an alias is known."""
    p = charts.period("1h")
    at = charts.window(p, NOW).start + timedelta(seconds=7)
    invented = ["gpt-4o", "nope", "unknown"] + [f"made-up-{i}" for i in range(20)]
    UsageRecord.objects.bulk_create([record(at, model="llama-70b")] * 3 + [record(at, model="llama")]
                                    + [record(at, model=name, ttft_ms=None) for name in invented])
    requests, tokens, _ = charts.usage_charts(UsageRecord.objects.all(), p, "model", NOW, UTC,
                                              catalog_names={"llama-70b", "llama", "qwen-7b"})
    assert series(requests) == {charts.UNKNOWN_MODEL: [23] + [0] * 59, "llama-70b": [3] + [0] * 59,
                                "llama": [1] + [0] * 59}
    assert series(tokens)[charts.UNKNOWN_MODEL][0] == 23 * 15
    # An empty catalog: every name is unknown.
    requests, _, _ = charts.usage_charts(UsageRecord.objects.all(), p, "model", NOW, UTC, catalog_names=())
    assert series(requests) == {charts.UNKNOWN_MODEL: [27] + [0] * 59}


@pytest.mark.django_db
def test_the_page_counts_names_outside_the_catalog_as_unknown_model(admin_client, make_model):
    make_model("qwen-7b")
    now = timezone.now()
    UsageRecord.objects.bulk_create([record(now - timedelta(minutes=2), model="qwen-7b"),
                                     record(now - timedelta(minutes=2), model="gpt-4o")])
    answer = admin_client.get("/admin/dashboard/charts/data/?period=1h&by=model").json()
    requests = next(c for c in answer["charts"] if c["id"] == "requests")
    assert sorted(s["label"] for s in requests["series"]) == ["qwen-7b", "unknown model"]


@pytest.mark.django_db
def test_ttft_p95_over_many_records_is_a_bounded_uniform_sample(monkeypatch):
    monkeypatch.setattr(charts, "TTFT_SAMPLE_MAX", 50)
    p = charts.period("1h")
    at = charts.window(p, NOW).start + timedelta(seconds=5)
    UsageRecord.objects.bulk_create([record(at, ttft_ms=float(i % 100)) for i in range(200)])
    _, _, ttft = charts.usage_charts(UsageRecord.objects.all(), p, "model", NOW, UTC)
    assert "every 4th of 200 records" in ttft.note
    assert 85 <= ttft.series[0].data[0] <= 99  # the sample's p95 is near the whole's (94)


@pytest.mark.django_db
def test_an_empty_period_says_so_in_a_sentence():
    UsageRecord.objects.bulk_create([record(NOW - timedelta(hours=3))])
    figures = charts.usage_charts(UsageRecord.objects.all(), charts.period("1h"), "model", NOW, UTC)
    assert [c.empty for c in figures] == ["No requests in the last hour."] * 3 and all(not c.series for c in figures)
    gpus = charts.gpu_charts(charts.period("1h"), NOW, UTC)
    assert all(c.empty.startswith("No GPU readings in the last hour.") for c in gpus)


@pytest.mark.django_db
def test_requests_without_a_first_token_leave_only_the_ttft_chart_empty():
    p = charts.period("1h")
    UsageRecord.objects.bulk_create([record(charts.window(p, NOW).start, ttft_ms=None, status=502)])
    requests, tokens, ttft = charts.usage_charts(UsageRecord.objects.all(), p, "model", NOW, UTC)
    assert requests.empty is None and series(requests)["llama-70b"][0] == 1 and tokens.empty is None
    assert ttft.empty == "No request sent a first token in the last hour."


@pytest.mark.django_db
def test_gpu_memory_sums_an_agents_gpus_and_utilisation_averages_them():
    p = charts.period("1h")
    w = charts.window(p, NOW)
    agent = Agent.objects.create(name="gpu-node-1")
    at0, at1 = w.start + timedelta(seconds=10), w.start + timedelta(seconds=40)
    GpuSample.objects.bulk_create([
        # GPU 0: 10 and 20 GiB in the first minute (mean 15); GPU 1: 30 GiB; 80 GiB each.
        GpuSample(agent=agent, agent_name="gpu-node-1", index=0, at=at0, memory_used_mib=10240,
                  memory_total_mib=81920, utilisation_pct=20),
        GpuSample(agent=agent, agent_name="gpu-node-1", index=0, at=at1, memory_used_mib=20480,
                  memory_total_mib=81920, utilisation_pct=40),
        GpuSample(agent=agent, agent_name="gpu-node-1", index=1, at=at0, memory_used_mib=30720,
                  memory_total_mib=81920, utilisation_pct=90),
        GpuSample(agent_name="old-node", index=0, at=w.start + timedelta(minutes=30), memory_used_mib=1024,
                  memory_total_mib=24576, utilisation_pct=None),
    ])
    memory, utilisation = charts.gpu_charts(p, NOW, UTC)
    assert [s.label for s in memory.series] == ["gpu-node-1 (2× 80 GiB)", "old-node (1× 24 GiB)"]
    assert series(memory)["gpu-node-1 (2× 80 GiB)"][:2] == [45.0, None]  # 15 + 30 GiB; no reading: a gap
    assert series(utilisation)["gpu-node-1 (2× 80 GiB)"][0] == 60.0  # mean of 30 and 90
    assert series(memory)["old-node (1× 24 GiB)"][30] == 1.0
    assert series(utilisation)["old-node (1× 24 GiB)"] == [None] * 60  # never reported utilisation


# --- The page and its JSON -------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_charts_are_for_staff_only(client, django_user_model):
    for url in ("/admin/dashboard/charts/", "/admin/dashboard/charts/data/"):
        assert client.get(url).status_code == 302  # to the admin login
    user = django_user_model.objects.create_user("viewer", password="password", is_staff=False)
    client.force_login(user)
    assert client.get("/admin/dashboard/charts/").status_code == 302
    user.is_staff = True
    user.save()
    assert client.get("/admin/dashboard/charts/").status_code == 403  # staff without the permission
    assert client.get("/admin/dashboard/charts/data/").status_code == 403


@pytest.mark.django_db
def test_usage_charts_need_the_usage_records_view_permission(client, django_user_model):
    user = django_user_model.objects.create_user("ops", password="password", is_staff=True)
    user.user_permissions.add(Permission.objects.get(codename="view_clustersettings"))
    client.force_login(user)
    UsageRecord.objects.bulk_create([record(timezone.now())])
    page = client.get("/admin/dashboard/charts/")
    assert page.status_code == 200
    assert "Usage charts need the permission to view usage records." in page.content.decode()
    assert [c["id"] for c in client.get("/admin/dashboard/charts/data/").json()["charts"]] == [
        "gpu-memory", "gpu-utilisation"]
    user.user_permissions.add(Permission.objects.get(codename="view_usagerecord"))
    client.force_login(django_user_model.objects.get(pk=user.pk))  # permissions are cached per user object
    ids = [c["id"] for c in client.get("/admin/dashboard/charts/data/").json()["charts"]]
    assert ids == ["requests", "tokens", "ttft", "gpu-memory", "gpu-utilisation"]


@pytest.mark.django_db
def test_the_page_offers_each_period_and_grouping_and_embeds_the_figures(admin_client):
    UsageRecord.objects.bulk_create([record(timezone.now() - timedelta(minutes=2), model="qwen-7b")])
    page = admin_client.get("/admin/dashboard/charts/?period=6h&by=model")
    html = page.content.decode()
    assert page.status_code == 200 and "Charts: the last 6 hours" in html
    for key in ("1h", "6h", "24h", "7d", "30d"):
        assert f'data-period="{key}"' in html
    assert 'data-period="6h" class="selected"' in html and 'data-by="model" class="selected"' in html
    assert 'id="canvas-requests"' in html and 'id="charts-data"' in html
    assert "fleet/vendor/chart.js/chart.umd.min.js" in html
    assert "No GPU readings in the last 6 hours." in html  # no samples: a sentence, no canvas
    assert 'id="canvas-gpu-memory"' not in html


@pytest.mark.django_db
def test_a_period_longer_than_records_are_kept_says_so(admin_client):
    ClusterSettings.objects.update_or_create(pk=1, defaults={"history_retention_days": 7})
    assert "Records are kept 7 days" in admin_client.get("/admin/dashboard/charts/?period=30d").content.decode()
    assert "Records are kept" not in admin_client.get("/admin/dashboard/charts/?period=7d").content.decode()


@pytest.mark.django_db
def test_an_unknown_period_is_a_400_naming_the_choices(admin_client):
    page = admin_client.get("/admin/dashboard/charts/?period=forever")
    assert page.status_code == 400 and "choose one of 1h, 6h, 24h, 7d, 30d" in page.content.decode()
    data = admin_client.get("/admin/dashboard/charts/data/?by=agent")
    assert data.status_code == 400 and data.json() == {
        "error": "Unknown grouping 'agent': choose one of model, key, team."}


@pytest.mark.django_db
def test_the_json_answers_every_chart_with_its_buckets(admin_client, make_model):
    make_model("llama-70b")
    UsageRecord.objects.bulk_create([record(timezone.now() - timedelta(minutes=1))])
    body = admin_client.get("/admin/dashboard/charts/data/?period=1h").json()
    assert body["period"] == "1h" and body["bucket_s"] == 60 and body["by"] == "model"
    requests = body["charts"][0]
    assert requests["id"] == "requests" and len(requests["labels"]) == 60
    assert requests["series"][0]["label"] == "llama-70b" and sum(requests["series"][0]["data"]) == 1


@pytest.mark.django_db
def test_a_hostile_model_name_is_escaped_in_the_page(admin_client):
    hostile = '</script><script>alert("x")</script>'
    team = Team.objects.create(name=hostile)
    UsageRecord.objects.bulk_create([record(timezone.now() - timedelta(minutes=1), model=hostile, team_id=team.pk)])
    html = admin_client.get("/admin/dashboard/charts/?period=1h").content.decode()
    assert hostile not in html and "script" not in html.split('id="charts-data"')[1].split("</script>")[0]
    assert '"unknown model"' in html  # a name outside the catalog is never a label
    html = admin_client.get("/admin/dashboard/charts/?period=1h&by=team").content.decode()
    assert hostile not in html and "\\u003C/script\\u003E" in html  # json_script escapes < and >


@pytest.mark.django_db
def test_the_admin_index_and_the_dashboard_link_to_the_charts(admin_client):
    assert 'href="/admin/dashboard/charts/"' in admin_client.get("/admin/").content.decode()
    assert 'href="/admin/dashboard/charts/"' in admin_client.get("/admin/dashboard/").content.decode()


async def test_the_real_web_app_serves_the_vendored_chart_library():
    """``llmgw up`` and ``llmgw web`` run uvicorn on ``llmgw.asgi:application`` with no
    collectstatic: its static handler must find the file in the app's static folder."""
    from llmgw.asgi import application

    transport = httpx.ASGITransport(app=application)
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as client:
        answer = await client.get("/static/fleet/vendor/chart.js/chart.umd.min.js")
    assert answer.status_code == 200, answer.text[:200]
    assert answer.text.startswith("/*!\n * Chart.js v4.6.1") and "Released under the MIT License" in answer.text[:300]


# --- In a real browser ----------------------------------------------------------------------------


def seed_a_busy_day(now: datetime) -> None:
    """A day of realistic traffic for four catalog models and three keys (two in teams), a
    few requests for a name no model has, and GPU readings every 5 minutes from the GPU
    machines already there (a deterministic random walk)."""
    rng = random.Random(19)
    search, evals = Team.objects.create(name="search"), Team.objects.create(name="evals")
    keys = [ApiKey.objects.create(name=name, prefix=f"sk-{i}f3a9", sha256=str(i) * 64, team=team)
            for i, (name, team) in enumerate((("search-backend", search), ("support-bot", None),
                                               ("nightly-evals", evals)))]
    models = {"llama-70b": (40, 900.0), "qwen-7b": (25, 180.0), "gemma-3-270m": (12, 60.0),
              "mistral-7b": (6, 220.0)}
    rows = []
    for minute in range(24 * 60, 0, -3):
        at = now - timedelta(minutes=minute)
        hour = (at.hour + at.minute / 60) % 24
        daylight = 0.25 + 0.75 * max(0.0, math.sin((hour - 6) / 14 * math.pi))  # busy 08:00–18:00
        for (model, (rate, ttft)), key in zip(models.items(), [keys[0], keys[1], keys[2], None]):
            for _ in range(rng.randint(0, int(rate * daylight / 4) + 1)):
                prompt = rng.randint(200, 1800)
                rows.append(record(at + timedelta(seconds=rng.randint(0, 170)), model=model, key=key,
                                   ttft_ms=ttft * (0.6 + daylight) * rng.uniform(0.7, 1.5), prompt=prompt,
                                   completion=rng.randint(20, 400)))
    rows += [record(now - timedelta(minutes=m), model="nope", key=keys[1], ttft_ms=None, prompt=0, completion=0,
                    status=404) for m in range(5, 600, 7)]  # a client's invented name: 404 model_not_found
    UsageRecord.objects.bulk_create(rows, batch_size=2000)
    samples = []
    for agent in Agent.objects.filter(gpus__isnull=False).distinct():  # the busy cluster's A100s, 40 GiB each
        gpus = list(agent.gpus.order_by("index"))
        used = [rng.uniform(10, 36) for _ in gpus]
        for step in range(24 * 12, 0, -1):
            at = now - timedelta(minutes=5 * step)
            for gpu, i in zip(gpus, range(len(gpus))):
                used[i] = min(39.5, max(1.0, used[i] + rng.uniform(-2, 2)))
                samples.append(GpuSample(agent=agent, agent_name=agent.name, index=gpu.index, at=at,
                                         memory_used_mib=int(used[i] * 1024), memory_total_mib=gpu.memory_total_mib,
                                         utilisation_pct=round(min(100.0, used[i] * 2.2 + rng.uniform(0, 12)), 1),
                                         temperature_c=60.0))
    GpuSample.objects.bulk_create(samples, batch_size=2000)


def canvas_is_drawn(driver, chart_id: str) -> bool:
    """Whether the chart exists in Chart.js and its canvas has coloured pixels."""
    return driver.execute_script(
        """const chart = window.llmgwCharts && window.llmgwCharts[arguments[0]];
           if (!chart) return false;
           const c = chart.canvas, data = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
           let inked = 0;
           for (let i = 3; i < data.length; i += 4) if (data[i] > 0) inked++;
           return inked > 500;""", chart_id)


@pytest.mark.timeout(150)
def test_the_charts_in_chromium_with_a_busy_day(browser, live_server, admin_user, busy, settings):  # noqa: F811
    from selenium.webdriver.common.by import By

    settings.LLMGW_DASHBOARD_REFRESH_S = 0  # a still picture of the dashboard
    ClusterSettings.objects.update_or_create(pk=1, defaults={"time_zone": "Europe/Berlin"})
    seed_a_busy_day(timezone.now())
    browser.set_window_size(1366, 1000)
    log_in(browser, live_server, admin_user)
    browser.save_screenshot(str(ARTIFACTS / "dashboard.png"))  # the README's picture of the dashboard

    browser.find_element(By.ID, "charts-link").click()
    wait_for(lambda: browser.execute_script("return window.llmgwCharts && Object.keys(window.llmgwCharts).length"),
             30, what="the charts page")
    ids = ("requests", "tokens", "ttft", "gpu-memory", "gpu-utilisation")
    for chart_id in ids:
        wait_for(lambda chart_id=chart_id: canvas_is_drawn(browser, chart_id), 30, what=f"the {chart_id} chart drawn")
    legend = browser.execute_script("return window.llmgwCharts.requests.data.datasets.map(d => d.label)")
    assert legend[:3] == ["llama-70b", "qwen-7b", "gemma-3-270m"]  # the catalog's, busiest first
    assert sorted(legend[3:]) == ["mistral-7b", "unknown model"]  # "nope" (404) is no series of its own
    assert browser.execute_script("return window.llmgwCharts.requests.data.labels.length") == 96
    gpus = browser.execute_script("return window.llmgwCharts['gpu-memory'].data.datasets.map(d => d.label)")
    assert gpus == ["gpu-node-1 (4× 40 GiB)", "gpu-node-2 (2× 40 GiB)"]
    assert browser.execute_script("return document.documentElement.scrollWidth") <= 1366  # nothing sideways
    browser.set_window_size(1366, 1500)
    path = ARTIFACTS / "charts.png"
    browser.save_screenshot(str(path))
    assert path.stat().st_size > 30_000

    # Per key, over the last hour: the chooser reloads the page with the keys' series.
    browser.find_element(By.CSS_SELECTOR, "#by-chooser a[data-by=key]").click()
    wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "#by-chooser a.selected[data-by=key]"), 30,
             what="the per-key page")
    wait_for(lambda: canvas_is_drawn(browser, "requests"), 30, what="the per-key charts")
    browser.find_element(By.CSS_SELECTOR, "#period-chooser a[data-period='1h']").click()
    wait_for(lambda: "Charts: the last hour" in browser.find_element(By.TAG_NAME, "h1").text, 30,
             what="the last hour")
    wait_for(lambda: canvas_is_drawn(browser, "tokens"), 30, what="the per-key tokens chart")
    labels = browser.execute_script("return window.llmgwCharts.tokens.data.datasets.map(d => d.label)")
    assert set(labels) <= {"search-backend (sk-0f3a9…)", "support-bot (sk-1f3a9…)", "nightly-evals (sk-2f3a9…)",
                           "no key"} and "search-backend (sk-0f3a9…)" in labels
    browser.save_screenshot(str(ARTIFACTS / "charts-per-key-1h.png"))

    # Per team: the chooser offers it; keys without a team are "no team".
    browser.find_element(By.CSS_SELECTOR, "#by-chooser a[data-by=team]").click()
    wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "#by-chooser a.selected[data-by=team]"), 30,
             what="the per-team page")
    wait_for(lambda: canvas_is_drawn(browser, "requests"), 30, what="the per-team charts")
    labels = browser.execute_script("return window.llmgwCharts.requests.data.datasets.map(d => d.label)")
    assert set(labels) <= {"search", "evals", "no team"} and {"search", "no team"} <= set(labels)
    assert browser.find_element(By.CSS_SELECTOR, "#usage-charts h2").text == "Requests per team (requests)"
    browser.save_screenshot(str(ARTIFACTS / "charts-per-team-1h.png"))


@pytest.mark.timeout(90)
def test_an_empty_cluster_in_chromium_says_so_instead_of_blank_axes(browser, live_server, admin_user):  # noqa: F811
    from selenium.webdriver.common.by import By

    log_in(browser, live_server, admin_user)
    browser.get(f"{live_server.url}/admin/dashboard/charts/?period=7d")
    wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "[data-role=empty]"), 30, what="the empty charts")
    empties = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "[data-role=empty]")]
    assert empties[:3] == ["No requests in the last 7 days."] * 3
    assert empties[3].startswith("No GPU readings in the last 7 days.")
    assert not browser.find_elements(By.TAG_NAME, "canvas")
    assert browser.execute_script("return typeof Chart") == "function"  # the library loaded all the same
    browser.save_screenshot(str(ARTIFACTS / "charts-empty.png"))
