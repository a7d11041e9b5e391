"""The cluster dashboard: its data (phases, who holds which GPU), the page and its actions
through Django's test client, and the page in headless Chromium for a stopped and a busy
cluster (screenshots under test-artifacts/), with the cordon button clicked and the page
refreshing itself without a reload."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.utils import timezone

from catalog.models import ClusterSettings, Model, Profile
from fleet.ops import dashboard
from fleet.models import Agent, Gpu, ModelState, Replica, ScalingEvent
from fleet.ops.operations import stop_cluster
from tests.browser import start_chromium
from tests.processes import ROOT

ARTIFACTS = ROOT / "test-artifacts"


# --- The data, pure -------------------------------------------------------------------------


@pytest.mark.parametrize("expected,kw", [
    ("external", dict(external=True, desired=0, states=[], unservable=False, last_state=None)),
    ("ready", dict(external=False, desired=2, states=["ready", "starting"], unservable=True, last_state="starting")),
    ("loading", dict(external=False, desired=1, states=["downloading"], unservable=False, last_state="downloading")),
    ("loading", dict(external=False, desired=1, states=[], unservable=False, last_state=None)),
    ("draining", dict(external=False, desired=0, states=["draining"], unservable=False, last_state="draining")),
    ("failed", dict(external=False, desired=1, states=[], unservable=True, last_state=None)),
    ("failed", dict(external=False, desired=1, states=[], unservable=False, last_state="failed")),
    ("cold", dict(external=False, desired=0, states=[], unservable=False, last_state="stopped")),
    ("cold", dict(external=False, desired=0, states=[], unservable=False, last_state="failed")),
])
def test_a_models_phase_says_where_it_stands(expected, kw):
    assert dashboard.model_phase(**kw) == expected


def test_percentages_are_clamped_and_survive_zero_totals():
    assert dashboard.percent(20, 80) == 25
    assert dashboard.percent(5, 0) == 0
    assert dashboard.percent(90, 80) == 100


def test_an_agent_row_maps_gpus_to_replicas_and_shows_download_progress():
    model = Model(name="llama-70b")
    agent = Agent(pk=1, name="gpu-node-1", cpu_cores=64, memory_mib=512000)
    gpus = [Gpu(index=1, memory_total_mib=40960, memory_used_mib=0), Gpu(index=0, memory_total_mib=40960)]
    replicas = [Replica(pk=7, model=model, state="downloading", gpu_indices=[0, 1], download_progress=0.424),
                Replica(pk=8, model=Model(name="tiny"), state="ready", cpu_cores=2, memory_mib=2048)]
    row = dashboard.agent_row(agent, gpus, replicas, alive=True)
    assert [g.index for g in row.gpus] == [0, 1]
    assert [h.label for h in row.gpus[1].holders] == ["downloading 42%"]
    assert (row.cpu_label, row.memory_label) == ("2 / 64 cores", "2.0 / 500.0 GiB RAM")
    assert [h.model for h in row.cpu_holders] == ["tiny"]


# --- A busy cluster and a stopped one ----------------------------------------------------------


def gpu_profile(name="vllm-2x40", gpus=2, memory=40960) -> Profile:
    profile = Profile(name=name, engine=Profile.Engine.VLLM, command="vllm serve {weights_path} --port {port}",
                      gpus_needed=gpus, gpu_memory_mib=memory)
    profile.full_clean()
    profile.save()
    return profile


@pytest.fixture
def busy(make_model, cpu_profile):
    """Two GPU machines and a CPU one; models ready, loading, draining, failed, cold and
    external; two scaling events."""
    now = timezone.now()
    big = gpu_profile()
    small = gpu_profile("vllm-1x20", gpus=1, memory=20480)
    g1 = Agent.objects.create(name="gpu-node-1", connected=True, last_seen_at=now, address="10.0.0.11",
                              version="0.3", cpu_cores=64, memory_mib=512000)
    g2 = Agent.objects.create(name="gpu-node-2", connected=True, last_seen_at=now, address="10.0.0.12",
                              version="0.3", cpu_cores=64, memory_mib=512000)
    c1 = Agent.objects.create(name="cpu-1", connected=True, last_seen_at=now, address="10.0.0.21", cpu_cores=8,
                              memory_mib=16384)
    for agent, used in ((g1, [39000, 38500, 18000, 0]), (g2, [0, 0])):
        for index, mib in enumerate(used):
            Gpu.objects.create(agent=agent, index=index, name="A100-SXM4-40GB", memory_total_mib=40960,
                               memory_used_mib=mib)
    llama = make_model("llama-70b", weights="hf:meta/llama-70b", profile=big, min_replicas=1, max_replicas=3)
    qwen = make_model("qwen-7b", weights="hf:qwen/qwen-7b", profile=small, min_replicas=1)
    gemma = make_model("gemma-3-270m", min_replicas=2, max_replicas=2)
    old = make_model("mistral-7b", weights="hf:mistral/7b", profile=small, min_replicas=0, on_demand=True)
    broken = make_model("deepseek-r1", weights="hf:deepseek/r1", profile=big, min_replicas=1)
    make_model("phi-lazy", min_replicas=0, on_demand=True)
    make_model("gpt-4o", weights="", profile=None, min_replicas=0, max_replicas=1,
               external_base_url="https://api.openai.com/v1")

    def replica(model, agent, state, gpus=(), profile=None, **kw):
        profile = profile or model.profile
        return Replica.objects.create(model=model, profile=profile, agent=agent, state=state, gpu_indices=list(gpus),
                                      cpu_cores=profile.cpu_cores, memory_mib=profile.memory_mib, port=5000, **kw)

    replica(llama, g1, "ready", (0, 1))
    replica(qwen, g1, "starting", (2,))
    replica(old, g2, "draining", (0,))
    replica(gemma, c1, "ready")
    replica(gemma, c1, "ready")
    replica(broken, g2, "failed", (), error="CUDA out of memory")
    reasons = {
        llama: (1, "placed on gpu-node-1 (GPUs 0,1): spread, then packed", False),
        qwen: (1, "placed on gpu-node-1 (GPU 2)", False),
        gemma: (2, "2 wanted, all placed", False),
        old: (0, "idle for 10 min (timeout 10 min): scaled to zero", False),
        broken: (1, "no agent has 2 free GPUs of 40 GiB; gpu-node-1: 1 free; gpu-node-2: cordoned", True),
    }
    for model, (desired, reason, unservable) in reasons.items():
        ModelState.objects.create(model=model, desired=desired, reason=reason, reason_at=now, unservable=unservable)
    ScalingEvent.objects.create(model=llama, at=now - timedelta(minutes=3), from_replicas=1, to_replicas=2,
                                reason="busy for 30 s: 4.0 requests waiting per replica")
    ScalingEvent.objects.create(model=llama, at=now - timedelta(minutes=1), from_replicas=2, to_replicas=1,
                                reason="quiet for 5 min")
    return {"gpu-node-1": g1, "gpu-node-2": g2, "cpu-1": c1}


def test_the_data_says_which_replica_holds_which_gpu_and_each_models_phase(busy):
    d = dashboard.load()
    agents = {a.name: a for a in d.agents}
    node = agents["gpu-node-1"]
    assert [(g.index, [h.model for h in g.holders]) for g in node.gpus] == [
        (0, ["llama-70b"]), (1, ["llama-70b"]), (2, ["qwen-7b"]), (3, [])]
    assert node.gpus[0].used_pct == 95 and node.gpus[0].memory_label == "38.1 / 40.0 GiB"
    cpu = agents["cpu-1"]
    assert (cpu.cpu_cores_used, cpu.memory_mib_used, cpu.cpu_pct) == (2, 256, 25)
    assert agents["gpu-node-2"].draining == 1
    phases = {m.name: m.phase for m in d.models}
    assert phases == {"llama-70b": "ready", "qwen-7b": "loading", "gemma-3-270m": "ready", "mistral-7b": "draining",
                      "deepseek-r1": "failed", "phi-lazy": "cold", "gpt-4o": "external"}
    assert [e.direction for e in d.events] == ["down", "up"]
    assert not d.stopped and d.running == 5


# --- The page and its actions (test client) ----------------------------------------------------


@pytest.mark.django_db
def test_the_dashboard_is_for_staff_only(client, django_user_model):
    assert client.get("/admin/dashboard/").status_code == 302
    django_user_model.objects.create_user("alice", password="pw")
    client.login(username="alice", password="pw")
    answer = client.get("/admin/dashboard/")
    assert answer.status_code == 302 and "/admin/login/" in answer["Location"]
    assert client.post("/admin/dashboard/cluster/stop/").status_code == 302
    assert not ClusterSettings.get_solo().stopped


def test_the_admin_index_links_to_the_dashboard(admin_client):
    page = admin_client.get("/admin/").content.decode()
    assert 'href="/admin/dashboard/"' in page and "Open the cluster dashboard" in page
    assert "Open the cluster dashboard" not in admin_client.get("/admin/catalog/").content.decode()


def test_the_page_and_its_fragment_show_the_busy_cluster(admin_client, busy):
    page = admin_client.get("/admin/dashboard/").content.decode()
    assert 'id="dashboard-live"' in page and "setInterval" in page
    fragment = admin_client.get("/admin/dashboard/live/").content.decode()
    assert "<html" not in fragment and 'id="serving-banner"' in fragment
    assert "no agent has 2 free GPUs of 40 GiB" in fragment and "quiet for 5 min" in fragment
    assert 'data-phase="failed"' in fragment and "38.1 / 40.0 GiB" in fragment


@pytest.mark.django_db
def test_the_model_table_badges_a_routing_policy_other_than_least_loaded(admin_client, make_model):
    make_model("spread")
    make_model("cached", routing_policy="prefix-affinity")
    make_model("chats", routing_policy="session")
    make_model("remote", weights="", profile=None, min_replicas=0, max_replicas=0, routing_policy="session",
               external_base_url="https://api.example.com/v1")  # routing does not apply: no badge
    badges = {m.name: m.routing_badge for m in dashboard.load().models}
    assert badges == {"spread": "", "cached": "prefix-affinity", "chats": "session", "remote": ""}
    fragment = admin_client.get("/admin/dashboard/live/").content.decode()
    row = fragment[fragment.index('data-model="cached"'):]
    row = row[:row.index("</tr>")]
    assert row.count('title="routing policy') == 1 and ">prefix-affinity</span>" in row
    assert fragment.count('title="routing policy') == 2


def test_stopping_from_the_dashboard_asks_first(admin_client):
    page = admin_client.get("/admin/dashboard/cluster/stop/")
    assert b"Yes, stop the cluster" in page.content and not ClusterSettings.get_solo().stopped
    answer = admin_client.post("/admin/dashboard/cluster/stop/")
    assert answer.status_code == 302 and answer["Location"] == "/admin/dashboard/"
    assert ClusterSettings.get_solo().stopped_by == "admin"
    fragment = admin_client.get("/admin/dashboard/live/").content.decode()
    assert 'id="stopped-banner"' in fragment and "by admin" in fragment
    admin_client.post("/admin/dashboard/cluster/start/")
    assert not ClusterSettings.get_solo().stopped


def test_draining_from_the_dashboard_asks_first_then_moves_replicas(admin_client, busy):
    node = busy["gpu-node-1"]
    assert b"Yes, drain gpu-node-1" in admin_client.get(f"/admin/dashboard/agents/{node.pk}/drain/").content
    assert not Agent.objects.get(pk=node.pk).cordoned
    answer = admin_client.post(f"/admin/dashboard/agents/{node.pk}/drain/", follow=True)
    assert "2 replica(s) moving to other agents" in answer.content.decode()
    assert Agent.objects.get(pk=node.pk).cordoned
    assert sorted(Replica.objects.filter(agent=node).values_list("state", flat=True)) == ["draining", "stopping"]


def test_cordon_is_a_post_and_uncordon_undoes_it(admin_client, busy):
    node = busy["cpu-1"]
    assert admin_client.get(f"/admin/dashboard/agents/{node.pk}/cordon/").status_code == 405
    admin_client.post(f"/admin/dashboard/agents/{node.pk}/cordon/")
    assert Agent.objects.get(pk=node.pk).cordoned
    admin_client.post(f"/admin/dashboard/agents/{node.pk}/uncordon/")
    assert not Agent.objects.get(pk=node.pk).cordoned


def test_want_and_evict_an_on_demand_model_from_the_dashboard(admin_client, busy):
    lazy = Model.objects.get(name="phi-lazy")
    admin_client.post(f"/admin/dashboard/models/{lazy.pk}/want/")
    assert ModelState.objects.get(model=lazy).wanted_at is not None
    assert b"Yes, evict phi-lazy" in admin_client.get(f"/admin/dashboard/models/{lazy.pk}/evict/").content
    admin_client.post(f"/admin/dashboard/models/{lazy.pk}/evict/")
    assert ModelState.objects.get(model=lazy).wanted_at is None
    always = Model.objects.get(name="gemma-3-270m")
    answer = admin_client.post(f"/admin/dashboard/models/{always.pk}/want/", follow=True)
    assert "not an on-demand model" in answer.content.decode()


def test_staff_without_permissions_see_no_buttons_and_cannot_act(client, django_user_model, busy):
    from django.contrib.auth.models import Permission

    viewer = django_user_model.objects.create_user("viewer", password="pw", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_clustersettings"))  # the page's own
    client.login(username="viewer", password="pw")
    fragment = client.get("/admin/dashboard/live/").content.decode()
    assert "gpu-node-1" in fragment and "Cordon" not in fragment and "Stop the cluster" not in fragment
    assert client.post(f"/admin/dashboard/agents/{busy['cpu-1'].pk}/cordon/").status_code == 403
    assert client.post("/admin/dashboard/cluster/stop/").status_code == 403
    assert not Agent.objects.get(pk=busy["cpu-1"].pk).cordoned and not ClusterSettings.get_solo().stopped


def test_the_agent_admin_can_drain(admin_client, busy):
    node = busy["gpu-node-1"]
    admin_client.post("/admin/fleet/agent/", {"action": "drain", "_selected_action": [node.pk]})
    assert Agent.objects.get(pk=node.pk).cordoned
    # As from the dashboard: the ready one drains, the one still starting stops.
    assert sorted(Replica.objects.filter(agent=node).values_list("state", flat=True)) == ["draining", "stopping"]


# --- In a real browser ---------------------------------------------------------------------------


@pytest.fixture
def browser(tmp_path):
    """Headless Debian chromium driven by the system chromedriver. Missing, the tests fail
    saying how to install them (bin/setup does it when run as root): never a silent pass."""
    driver = start_chromium(tmp_path, "1400,1100")
    ARTIFACTS.mkdir(exist_ok=True)
    yield driver
    driver.quit()


def wait_for(predicate, timeout_s: float = 10.0, what: str = "the page"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except Exception:  # the element is being swapped by a refresh
            value = None
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def log_in(browser, live_server, admin_user) -> None:
    from selenium.webdriver.common.by import By

    browser.get(f"{live_server.url}/admin/login/?next=/admin/dashboard/")
    browser.find_element(By.NAME, "username").send_keys(admin_user.username)
    browser.find_element(By.NAME, "password").send_keys("password")
    browser.find_element(By.CSS_SELECTOR, "input[type=submit]").click()
    wait_for(lambda: browser.find_element(By.ID, "dashboard-live"), what="the dashboard after logging in")


def save_screenshot(browser, name: str) -> None:
    path = ARTIFACTS / name
    browser.save_screenshot(str(path))
    assert path.stat().st_size > 10_000


@pytest.mark.timeout(90)
def test_a_stopped_cluster_in_chromium(browser, live_server, admin_user, make_model, settings):
    from selenium.webdriver.common.by import By

    settings.LLMGW_DASHBOARD_REFRESH_S = 0  # a still picture
    Agent.objects.create(name="gpu-node-1", connected=True, last_seen_at=timezone.now(), cpu_cores=64,
                         memory_mib=512000)
    make_model("llama-70b")
    stop_cluster("night-shift")
    log_in(browser, live_server, admin_user)
    banner = browser.find_element(By.ID, "stopped-banner")
    assert "STOPPED" in banner.text and "night-shift" in banner.text and "Every GPU is free" in banner.text
    assert banner.value_of_css_property("font-weight") == "700"  # computed style: bold is 700
    assert browser.find_element(By.ID, "cluster-start").text == "Start the cluster…"
    assert "cluster stopped" in browser.find_element(By.CSS_SELECTOR, "tr[data-model='llama-70b']").text
    save_screenshot(browser, "dashboard-stopped.png")


@pytest.mark.timeout(90)
def test_a_busy_cluster_in_chromium_cordon_and_live_refresh(browser, live_server, admin_user, busy, settings):
    from selenium.webdriver.common.by import By

    settings.LLMGW_DASHBOARD_REFRESH_S = 0.5
    log_in(browser, live_server, admin_user)
    node = browser.find_element(By.ID, "agent-gpu-node-1")
    bars = node.find_elements(By.CSS_SELECTOR, ".gpu .llmgw-bar > span")
    widths = [round(b.size["width"] / b.find_element(By.XPATH, "..").size["width"] * 100) for b in bars]
    assert [abs(w - e) <= 2 for w, e in zip(widths, [95, 94, 44, 0])] == [True] * 4, widths
    gpu2 = node.find_element(By.CSS_SELECTOR, ".gpu[data-gpu='2']").text
    assert "qwen-7b" in gpu2 and "starting" in gpu2
    phases = {row.get_attribute("data-model"): row.get_attribute("data-phase")
              for row in browser.find_elements(By.CSS_SELECTOR, "#models tr[data-model]")}
    assert phases["deepseek-r1"] == "failed" and phases["gpt-4o"] == "external" and phases["qwen-7b"] == "loading"
    assert "no agent has 2 free GPUs" in browser.find_element(By.CSS_SELECTOR, "tr[data-model='deepseek-r1']").text
    assert len(browser.find_elements(By.CSS_SELECTOR, "#events tr.event")) == 2
    save_screenshot(browser, "dashboard-busy.png")

    # Cordon: the button posts, the page comes back with the agent marked and a message.
    browser.find_element(By.CSS_SELECTOR, "#agent-gpu-node-1 input[name=cordon]").click()
    wait_for(lambda: "Cordoned gpu-node-1" in browser.find_element(By.CSS_SELECTOR, "ul.messagelist").text,
             what="the cordon message")
    assert browser.find_element(By.CSS_SELECTOR, "#agent-gpu-node-1 [data-role=cordoned]").text == "cordoned"
    assert browser.find_elements(By.CSS_SELECTOR, "#agent-gpu-node-1 input[name=uncordon]")
    assert Agent.objects.get(name="gpu-node-1").cordoned
    assert not Agent.objects.get(name="gpu-node-2").cordoned

    # Live refresh: nothing is swapped while nothing changes; a change made elsewhere shows
    # up without the page reloading.
    live = browser.find_element(By.ID, "dashboard-live")
    wait_for(lambda: int(live.get_attribute("data-refreshes")) >= 2, what="two refreshes")
    assert live.get_attribute("data-swaps") == "0"
    browser.execute_script("window.stillTheSamePage = true;")
    Agent.objects.filter(name="gpu-node-2").update(cordoned=True)
    wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "#agent-gpu-node-2 [data-role=cordoned]"),
             what="gpu-node-2 to show as cordoned after a refresh")
    assert browser.execute_script("return window.stillTheSamePage === true")
    assert int(browser.find_element(By.ID, "dashboard-live").get_attribute("data-swaps")) >= 1
    save_screenshot(browser, "dashboard-busy-cordoned.png")


@pytest.mark.django_db
def test_the_dashboard_lists_replicas_stopped_lately_with_why(admin_client, make_model):
    """Issue 14: an engine its agent stopped on its own after a restart is shown in words; a
    stop older than fleet.ops.cluster.RECENTLY_STOPPED is not listed."""
    from fleet.ops.cluster import RECENTLY_STOPPED
    from tests import rows

    m = make_model("chat")
    a = rows.agent("gpu-7")
    why = "surplus: 2 running, 1 wanted; stopped after the agent's restart: not assigned"
    lately = rows.replica(m, a, state="stopped", reason=why)
    old = rows.replica(m, a, state="stopped", reason="an old stop")
    Replica.objects.filter(pk=old.pk).update(state_changed_at=timezone.now() - RECENTLY_STOPPED - timedelta(seconds=5))
    d = dashboard.load()
    assert [(s.replica_id, s.agent, s.reason) for s in d.stops] == [(lately.pk, "gpu-7", why)]
    fragment = admin_client.get("/admin/dashboard/live/").content.decode()
    assert f"r{lately.pk}" in fragment and "not assigned" in fragment and "an old stop" not in fragment
