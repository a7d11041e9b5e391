"""The admin answers questions (issue 19): usage records with durations to the
millisecond, the endpoint and links; a model's page with where it stands (replicas,
outdated ones, the last failure, explain) and its recent usage; list pages with state,
reason and a failed replica's error line; internal fields read-only; hostile names escaped
and cut. Through Django's test client, then at 1366 px in headless Chromium (no horizontal
scroll; screenshots under test-artifacts/)."""

from __future__ import annotations

import html
import re
import time
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from catalog.models import Model
from fleet.models import Agent, ApiToken, ControlPlane, Gpu, ModelState, Replica, ScalingEvent
from gateway.models import ApiKey, Team, UsageRecord
from tests import rows
from tests.browser import start_chromium
from tests.processes import ROOT

pytestmark = pytest.mark.django_db

ARTIFACTS = ROOT / "test-artifacts"
LOGS = Path(__file__).resolve().parent.parent / "fixtures" / "engine_logs"
#: A name no validator lets through, set behind the catalog's back (an old row, a bug, a
#: database edited by hand): the pages must escape it and keep their layout.
HOSTILE = "<script>alert(1)</script>" + "x" * 100
SCRIPT = "<script>alert(1)"


@pytest.fixture(autouse=True)
def no_control_planes():
    """Each test says which agents are silent: a web process's row left by an earlier test
    (committed on PostgreSQL) would make ``listening_since`` "now" and every silent agent
    heard from (as in tests/ops/test_read_model.py)."""
    ControlPlane.objects.all().delete()


def hostile_rows(make_model):
    """A model with a hostile name (its failed replica's log says the port was taken, one
    ready but outdated replica), a healthy model, an agent, a key and usage rows."""
    m = make_model("victim", min_replicas=2, max_replicas=2)
    Model.objects.filter(pk=m.pk).update(name=HOSTILE, aliases=HOSTILE[:100])
    m.refresh_from_db()
    healthy = make_model("gemma-3-270m")
    node = rows.agent("gpu-node-1")
    Gpu.objects.create(agent=node, index=0, name="A100-SXM4-40GB", memory_total_mib=40960, memory_used_mib=20000,
                       utilisation_pct=55.0, temperature_c=61.0)
    rows.replica(m, node, state="ready", ready_at=timezone.now() - timedelta(hours=1), gpu_indices=[0],
                 spec_hash="0" * 64)  # started from an older spec: outdated
    error = ("engine exited with code 1 while starting\n--- last log lines ---\n"
             + (LOGS / "uvicorn_address_in_use.log").read_text().strip())
    failed = rows.replica(m, node, state="failed", error=error, reason="placed on gpu-node-1 " + "y" * 200)
    rows.replica(healthy, node, state="ready", ready_at=timezone.now())
    ModelState.objects.create(model=m, desired=2, reason="crash loop: 3 failures in 10 min; " + "z" * 300,
                              reason_at=timezone.now(), unservable=True)
    ModelState.objects.create(model=healthy, desired=1, reason="1 wanted, all placed", reason_at=timezone.now())
    ScalingEvent.objects.create(model=m, from_replicas=1, to_replicas=2,
                                reason="wanted: 2 (min_replicas) — " + "scale up after queue wait " * 12)
    team = Team.objects.create(name="research", tokens_per_day=5_000_000, requests_per_minute=60)
    key = ApiKey.objects.create(name="team-a-ci", prefix="llmgw-key-YTd1sWOx-uoR", sha256="0" * 64, team=team,
                                expires_at=timezone.now() + timedelta(days=30))
    ApiKey.objects.create(name="bench gemma-3-270m", prefix="llmgw-key--IPXZjwYJtrP", sha256="1" * 64,
                          revoked_at=timezone.now())
    now = timezone.now()
    for n in range(3):
        UsageRecord.objects.create(at=now - timedelta(minutes=n), key=key, model_name=HOSTILE, replica_id=failed.pk,
                                   path="/v1/chat/completions", status=200, upstream_status=200, stream=True,
                                   prompt_tokens=12, completion_tokens=345, ttft_ms=87.4321, total_ms=1234.5678,
                                   overhead_ms=0.4567)
    UsageRecord.objects.create(at=now, key=None, model_name="deleted-model", replica_id=None, path="/v1/embeddings",
                               status=502, upstream_status=500, prompt_tokens=3, total_ms=15.2)
    return {"model": m, "healthy": healthy, "agent": node, "failed": failed, "key": key, "team": team}


def page_of(answer) -> str:
    assert answer.status_code == 200, answer.status_code
    return answer.content.decode()


def assert_escaped(page: str) -> None:
    assert SCRIPT not in page and "&lt;script&gt;alert(1)" in page


# --- Usage records ---------------------------------------------------------------------------


def test_usage_records_round_to_the_millisecond_name_the_endpoint_and_link(admin_client, make_model):
    made = hostile_rows(make_model)
    page = page_of(admin_client.get("/admin/gateway/usagerecord/"))
    assert_escaped(page)
    for column in ("when", "key_link", "model_link", "endpoint", "replica_link", "status_shown", "ttft", "total",
                   "overhead"):
        assert f"column-{column}" in page, column
    assert ">1,235 ms<" in page and ">87 ms<" in page and ">0 ms<" in page and "1234.5678" not in page
    assert '<td class="field-endpoint">/v1/chat/completions (streamed)</td>' in page
    assert f'href="/admin/gateway/apikey/{made["key"].pk}/change/"' in page
    assert f'href="/admin/catalog/model/{made["model"].pk}/change/"' in page
    assert f'href="/admin/fleet/replica/{made["failed"].pk}/change/"' in page
    assert "502 (upstream 500)" in page
    # A model no longer in the catalog: its name, no link.
    cell = re.search(r'<td class="field-model_link">([^<]*)</td>', page)
    assert cell and cell.group(1) == "deleted-model"
    # The hostile name: cut to 40 characters with the whole (escaped) in the title.
    shown = html.escape(HOSTILE[:39], quote=True)
    assert f'<span title="{html.escape(HOSTILE, quote=True)}">{shown}…</span>' in page
    # The totals above the list cut it too.
    assert f'title="{html.escape(HOSTILE, quote=True)}"' in page.split('id="result_list"')[0]


def test_usage_totals_count_names_outside_the_catalog_as_one_unknown_model(admin_client, make_model):
    made = hostile_rows(make_model)
    now = timezone.now()
    for name, n in (("gpt-4o", 2), ("nope", 1), ("gemma-3-270m", 1)):
        for _ in range(n):
            UsageRecord.objects.create(at=now, key=made["key"], model_name=name, path="/v1/chat/completions",
                                       status=404 if name != "gemma-3-270m" else 200, prompt_tokens=0, total_ms=1.0)
    page = page_of(admin_client.get("/admin/gateway/usagerecord/"))
    totals = page[page.index('id="totals-by-model"'):]
    totals = totals[:totals.index("</table>")]
    # A model since deleted is in the catalog no more: 2 + 1 invented requests and its 1.
    assert re.search(r'<em>unknown model</em></td><td class="num">4</td>', totals), totals
    assert "gpt-4o" not in totals and "nope" not in totals and "deleted-model" not in totals
    assert '>gemma-3-270m</td><td class="num">1</td>' in totals


def test_a_usage_record_page_is_read_only(admin_client, make_model):
    hostile_rows(make_model)
    record = UsageRecord.objects.filter(path="/v1/chat/completions").first()
    page = page_of(admin_client.get(f"/admin/gateway/usagerecord/{record.pk}/change/"))
    assert_escaped(page)
    assert "1,235 ms" in page and "/v1/chat/completions" in page
    assert not re.search(r'<(input|textarea|select)[^>]*name="(path|status|model_name|total_ms|key)"', page)


# --- Teams, keys and times ----------------------------------------------------------------------

INSTANT = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC"


def test_team_and_key_pages_show_instants_to_the_second_with_the_zone(admin_client, make_model):
    made = hostile_rows(make_model)
    team, key = made["team"], made["key"]
    for path, stamps in (
            (f"/admin/gateway/team/{team.pk}/change/", [team.created_at, team.updated_at]),
            (f"/admin/gateway/apikey/{key.pk}/change/", [key.created_at]),
            ("/admin/gateway/team/", [team.created_at]),
            ("/admin/gateway/apikey/", [key.created_at, key.expires_at]),
            ("/admin/gateway/usagerecord/", [UsageRecord.objects.earliest("at").at])):
        page = page_of(admin_client.get(path))
        for stamp in stamps:
            assert timezone.localtime(stamp).strftime("%Y-%m-%d %H:%M:%S UTC") in page, (path, stamp)
        assert not re.search(r"\b(a|p)\.m\.", page), path  # no "Dec. 4, 2026, 6:47 p.m."
        assert not re.search(r"\d\d:\d\d(:\d\d)?\+00:00", page), path  # no ISO 8601 with an offset
    # The usage panel's resets: an instant like the others.
    page = page_of(admin_client.get(f"/admin/gateway/team/{team.pk}/change/"))
    panel = page[page.index('class="tenant-usage"'):]
    assert re.search(f"<td>{INSTANT}</td>", panel[:panel.index("</table>")])


def test_integer_inputs_are_wide_enough_for_twelve_digits(admin_client, make_model):
    """Django's admin draws an integer input 5em wide (six digits of 5000000 show): llmgw's
    stylesheet widens every one (teams', keys' and models' limits, budgets and counts)."""
    made = hostile_rows(make_model)
    page = page_of(admin_client.get(f"/admin/gateway/team/{made['team'].pk}/change/"))
    assert re.search(r'<input type="number" name="tokens_per_day" value="5000000"[^>]*class="vIntegerField"', page)
    rule = re.search(r"input\.vIntegerField[^{]*\{([^}]*)\}", page)
    assert rule and "width: 15ch" in rule.group(1)


# --- A model's page and the model list --------------------------------------------------------


def test_a_models_page_shows_where_it_stands_its_failure_explain_and_usage(admin_client, make_model):
    made = hostile_rows(make_model)
    page = page_of(admin_client.get(f"/admin/catalog/model/{made['model'].pk}/change/"))
    assert_escaped(page)
    live = page[page.index('class="llmgw-live"'):]
    live = live[:live.index("</div>")]
    assert '<span id="model-state">1 of 2 ready · ready</span>' in live  # the outdated one still serves
    assert "crash loop: 3 failures in 10 min" in live
    assert "1 replica(s) started from an older spec, being replaced" in live
    failed = made["failed"]
    when = timezone.localtime(failed.state_changed_at).strftime("%Y-%m-%d %H:%M:%S UTC")
    assert (f"<strong>Last failure:</strong> {when} (replica {failed.pk}): engine exited with code 1 while starting: "
            "ERROR:    [Errno 98] error while attempting to bind on address (&#x27;127.0.0.1&#x27;, 20001): "
            "address already in use") in live
    assert f'href="/admin/fleet/replica/{failed.pk}/change/"' in live and "outdated, being replaced" in live
    assert 'id="model-explain"' in live and "  why:         crash loop" in live  # explain's own text
    usage = page[page.index('id="usage-24h"'):]
    assert usage.startswith('id="usage-24h">Last 24 hours: 3 requests, 0 errors, 36 prompt and 1,035 completion '
                            "tokens, TTFT p95 87 ms.")
    assert "team-a-ci" in usage and "/admin/gateway/usagerecord/?model_name=" in usage


def test_a_models_usage_is_shown_only_to_who_may_see_usage_records(client, django_user_model, make_model):
    from django.contrib.auth.models import Permission

    made = hostile_rows(make_model)
    viewer = django_user_model.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_model"))
    client.login(username="viewer", password="pw")
    page = page_of(client.get(f"/admin/catalog/model/{made['model'].pk}/change/"))
    assert 'id="model-explain"' in page and 'id="usage-24h"' not in page and "team-a-ci" not in page
    viewer.user_permissions.add(Permission.objects.get(codename="view_usagerecord"))
    viewer = django_user_model.objects.get(pk=viewer.pk)  # permissions are cached per object
    client.force_login(viewer)
    assert 'id="usage-24h"' in page_of(client.get(f"/admin/catalog/model/{made['model'].pk}/change/"))


def test_a_failure_is_cleared_from_the_models_page_once_a_replica_is_ready_since(admin_client, make_model):
    made = hostile_rows(make_model)
    rows.replica(made["model"], made["agent"], state="ready", ready_at=timezone.now() + timedelta(seconds=1))
    page = page_of(admin_client.get(f"/admin/catalog/model/{made['model'].pk}/change/"))
    assert "<strong>Last failure:</strong> none since a replica last became ready" in page


def test_the_model_list_shows_state_and_reason_cut_and_escaped(admin_client, make_model):
    made = hostile_rows(make_model)
    page = page_of(admin_client.get("/admin/catalog/model/"))
    assert_escaped(page)
    assert "column-state" in page and "column-reason" in page
    assert "1 of 1 ready · ready" in page and "1 wanted, all placed" in page
    reason = ModelState.objects.get(model=made["model"]).reason
    assert f'<span title="{reason}">{reason[:59]}…</span>' in page


# --- Replicas, agents and internals -------------------------------------------------------------


def test_the_replica_list_has_a_failed_replicas_error_line(admin_client, make_model):
    made = hostile_rows(make_model)
    page = page_of(admin_client.get("/admin/fleet/replica/"))
    assert_escaped(page)
    shown = ("ERROR:    [Errno 98] error while attempting to bind on address (&#x27;127.0.0.1&#x27;, 20001): "
             "address already in use")
    line = f"engine exited with code 1 while starting: {shown}"
    assert f'<span title="{line}">{shown}</span>' in page and "column-error_line" in page
    assert f'href="/admin/fleet/replica/{made["failed"].pk}/change/"' in page
    assert "ready, outdated" in page and "Application shutdown complete" not in page
    assert page.count('class="field-error_line">-</td>') == 2  # the ready ones have none


def test_the_agent_list_says_alive_lost_and_cordoned(admin_client, make_model):
    hostile_rows(make_model)
    Agent.objects.create(name="gpu-node-9", connected=True, cordoned=True,
                         last_seen_at=timezone.now() - timedelta(hours=2))
    page = page_of(admin_client.get("/admin/fleet/agent/"))
    assert ">alive<" in page and ">lost (silent for 2 h), cordoned<" in page
    assert "1 GPU · 4 cores · 8 GiB" in page and '<td class="field-replica_count">2</td>' in page


def test_internal_fields_are_read_only(admin_client, make_model):
    made = hostile_rows(make_model)
    node = made["agent"]
    page = page_of(admin_client.get(f"/admin/fleet/agent/{node.pk}/change/"))
    for name in ("generation", "restart_generation", "session", "token_prefix", "gpus-0-memory_used_mib",
                 "gpus-0-utilisation_pct", "gpus-0-temperature_c", "gpus-0-index"):
        assert f'name="{name}"' not in page, name
    assert "A100-SXM4-40GB" in page
    generation = node.generation
    admin_client.post(f"/admin/fleet/agent/{node.pk}/change/", {
        "name": node.name, "generation": 999, "session": "forged", "gpus-TOTAL_FORMS": "1",
        "gpus-INITIAL_FORMS": "1", "gpus-0-id": node.gpus.get().pk, "gpus-0-agent": node.pk,
        "gpus-0-memory_used_mib": 1})
    node.refresh_from_db()
    assert (node.generation, node.session, node.gpus.get().memory_used_mib) == (generation, "", 20000)
    state = ModelState.objects.get(model=made["model"])
    page = page_of(admin_client.get(f"/admin/fleet/modelstate/{state.pk}/change/"))
    assert not re.search(r'<(input|textarea|select)[^>]*name="(desired|reason|extra_replicas)"', page)
    page = page_of(admin_client.get(f"/admin/fleet/replica/{made['failed'].pk}/change/"))
    assert not re.search(r'<(input|textarea|select)[^>]*name="(state|error|spec_hash|engine_key)"', page)
    assert made["failed"].engine_key not in page


def test_replicas_their_models_state_and_scaling_history_cannot_be_deleted_in_the_admin(admin_client, make_model):
    """A replica's row dropped under its running engine would orphan the engine; the
    reconciler's state and the scaling history are its own (pruned by retention)."""
    made = hostile_rows(make_model)
    replica = made["failed"]
    state = ModelState.objects.get(model=made["model"])
    for url in (f"/admin/fleet/replica/{replica.pk}/delete/", f"/admin/fleet/modelstate/{state.pk}/delete/"):
        assert admin_client.post(url, {"post": "yes"}).status_code == 403, url
    answer = admin_client.post("/admin/fleet/replica/", {"action": "delete_selected", "_selected_action": [replica.pk],
                                                         "post": "yes"})
    assert answer.status_code in (200, 302)
    assert Replica.objects.filter(pk=replica.pk).exists() and ModelState.objects.filter(pk=state.pk).exists()
    assert "delete_selected" not in page_of(admin_client.get("/admin/fleet/replica/"))


# --- At 1366 px in a real browser ------------------------------------------------------------------


@pytest.fixture
def browser(tmp_path):
    """Headless Debian chromium at 1366 × 900 driven by the system chromedriver (as
    tests/ops/test_dashboard.py). Missing, the tests fail saying how to install them."""
    driver = start_chromium(tmp_path, "1366,900")
    ARTIFACTS.mkdir(exist_ok=True)
    yield driver
    driver.quit()


@pytest.mark.timeout(120)
def test_the_admin_pages_fit_1366_px_with_a_failed_replica_and_a_hostile_name(browser, live_server, admin_user,
                                                                             make_model):
    from selenium.common.exceptions import NoAlertPresentException
    from selenium.webdriver.common.by import By

    made = hostile_rows(make_model)
    ApiToken.issue(admin_user)
    ApiToken.objects.update(last_used_at=timezone.now())
    browser.get(f"{live_server.url}/admin/login/?next=/admin/")
    browser.find_element(By.NAME, "username").send_keys(admin_user.username)
    browser.find_element(By.NAME, "password").send_keys("password")
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    deadline = time.monotonic() + 30
    while not browser.find_elements(By.ID, "user-tools"):  # logged in: the admin's index
        assert time.monotonic() < deadline, "timed out waiting for the admin after logging in"
        time.sleep(0.1)
    assert browser.execute_script("return window.innerWidth") == 1366
    pages = {
        "admin-models.png": "/admin/catalog/model/",
        "admin-replicas.png": "/admin/fleet/replica/",
        "admin-agents.png": "/admin/fleet/agent/",
        "admin-usage.png": "/admin/gateway/usagerecord/",
        "admin-keys.png": "/admin/gateway/apikey/",
        "admin-teams.png": "/admin/gateway/team/",
        "admin-team-page.png": f"/admin/gateway/team/{made['team'].pk}/change/",
        "admin-key-page.png": f"/admin/gateway/apikey/{made['key'].pk}/change/",
        "admin-scaling-events.png": "/admin/fleet/scalingevent/",
        "admin-model-states.png": "/admin/fleet/modelstate/",
        "admin-api-tokens.png": "/admin/fleet/apitoken/",
        "admin-profiles.png": "/admin/catalog/profile/",
        "admin-cluster-settings.png": "/admin/catalog/clustersettings/",
        # Last: its panels are read below.
        "admin-model-page.png": f"/admin/catalog/model/{made['model'].pk}/change/",
    }
    # A cell's text on more than one line (a word broken mid-word: "activ e"), overflowing
    # its cell, or touching the next one ("REQUESTSPROMPT TOKENS": less than 12 px to spare).
    lines_of = ("return Array.from(document.querySelectorAll(arguments[0])).filter(c => c.textContent.trim())"
                ".map(function (cell) {"
                "  const tops = new Set(), walk = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);"
                "  let left = Infinity, right = -Infinity;"
                "  for (let node = walk.nextNode(); node; node = walk.nextNode()) {"
                "    if (!node.textContent.trim()) continue;"
                "    const range = document.createRange(); range.selectNodeContents(node);"
                "    for (const r of range.getClientRects()) if (r.width > 0) {"
                "      tops.add(Math.round(r.top));"
                "      left = Math.min(left, r.left); right = Math.max(right, r.right); } }"
                "  const box = cell.getBoundingClientRect();"
                "  return [cell.textContent.trim(), tops.size,"
                "          cell.scrollWidth <= cell.clientWidth && box.width - (right - left) >= 12]; })")
    one_line = {  # short cells of each list, which must never wrap
        "/admin/gateway/apikey/": "#result_list td.field-prefix, #result_list td.field-state, "
                                  "#result_list td.field-priority, #result_list thead th",
        "/admin/gateway/team/": "#result_list th.field-name, #result_list td.field-priority, #result_list thead th",
        "/admin/gateway/usagerecord/": "table.llmgw-totals th, table.llmgw-totals td, #result_list td.field-tokens, "
                                       "#result_list td.field-total",
        f"/admin/catalog/model/{made['model'].pk}/change/": ".llmgw-usage td:nth-child(n+4), .llmgw-usage th",
    }
    # Where a cell may wrap, it breaks lines between words only: after a space, "-" or "/".
    mid_word = ("return Array.from(document.querySelectorAll(arguments[0])).flatMap(function (cell) {"
                "  const found = [], walk = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);"
                "  let last = null, before = ' ';"
                "  for (let node = walk.nextNode(); node; node = walk.nextNode()) {"
                "    const text = node.textContent;"
                "    for (let i = 0; i < text.length; i++) {"
                "      const range = document.createRange(); range.setStart(node, i); range.setEnd(node, i + 1);"
                "      const rects = range.getClientRects(); if (!rects.length) continue;"
                "      const top = Math.round(rects[0].top);"
                "      if (last !== null && top > last + 2 && !' -/'.includes(before) && text[i] !== ' ')"
                "        found.push(cell.textContent.trim() + ' at ' + i);"
                "      last = top; before = text[i]; } }"
                "  return found; })")
    whole_words = {
        "/admin/gateway/apikey/": "#result_list td, #result_list th",
        "/admin/gateway/team/": "#result_list td, #result_list th",
        "/admin/fleet/apitoken/": "#result_list td, #result_list th",
        "/admin/catalog/profile/": "#result_list td, #result_list th",
        "/admin/fleet/modelstate/": "#result_list td.field-reason_at, #result_list td.field-wanted_at",
        "/admin/fleet/scalingevent/": "#result_list th.field-when, #result_list td.field-reason_cut",
        "/admin/gateway/usagerecord/": "#result_list td:not(.field-model_link), #result_list th",
        f"/admin/catalog/model/{made['model'].pk}/change/": ".llmgw-usage td, .llmgw-usage th",
    }
    for shot, path in pages.items():
        browser.get(live_server.url + path)
        browser.find_element(By.ID, "content")  # the page is there, not a login or an error
        with pytest.raises(NoAlertPresentException):
            browser.switch_to.alert  # noqa: B018 (the name <script>alert(1)</script> never ran)
        assert not browser.find_elements(By.XPATH, "//script[contains(., 'alert(1)')]"), path  # escaped, never run
        scroll, inner = browser.execute_script(
            "return [document.documentElement.scrollWidth, window.innerWidth]")
        # The admin puts a list in its own scrolling box: it must not scroll either.
        box, box_width = browser.execute_script(
            "const r = document.querySelector('.results'); return r ? [r.scrollWidth, r.clientWidth] : [0, 0]")
        browser.save_screenshot(str(ARTIFACTS / shot))
        assert (ARTIFACTS / shot).stat().st_size > 10_000
        assert scroll <= inner, f"{path} scrolls sideways at 1366 px: {scroll} > {inner} (see {shot})"
        assert box <= box_width, f"{path}'s list scrolls sideways at 1366 px: {box} > {box_width} (see {shot})"
        if path in one_line:
            cells = browser.execute_script(lines_of, one_line[path])
            assert cells, f"nothing matches {one_line[path]!r} on {path}"
            for text, lines, fits in cells:
                assert lines == 1 and fits, (f"{path}: {text!r} takes {lines} lines, overflows its cell or "
                                             f"touches the next (see {shot})")
        if path in whole_words:
            broken = browser.execute_script(mid_word, whole_words[path])
            assert not broken, f"{path}: words broken mid-word: {broken} (see {shot})"
        if path.startswith("/admin/gateway/team/") and path.endswith("/change/"):
            # A limit is shown whole: twelve digits fit the input with room to spare.
            for name in ("tokens_per_day", "requests_per_minute"):
                field = browser.find_element(By.NAME, name)
                browser.execute_script("arguments[0].value = '5000000000'", field)
                inner, width = browser.execute_script("return [arguments[0].scrollWidth, arguments[0].clientWidth]",
                                                      field)
                assert inner <= width, f"{name} shows 5000000000 cut: {inner} > {width} px (see {shot})"
                assert width >= 110, f"{name} is {width} px wide (see {shot})"
    # The model's page shows the last failure and a replica's error line on screen.
    failure = browser.find_element(By.ID, "last-failure").text
    assert "address already in use" in failure and f"replica {made['failed'].pk}" in failure
    assert "crash loop" in browser.find_element(By.ID, "model-explain").text
