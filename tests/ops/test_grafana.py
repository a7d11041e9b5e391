"""The shipped Grafana dashboard (``docs/grafana/llmgw.json``) and README's sample alerts:
importable JSON, and every query naming a metric that a real web process's ``/metrics``
serves — checked against a scrape taken after real requests (answered, and held for a cold
start), so the series exist — and never joining (``+``, ``/``, ``>``…) a series that a
fresh process does not have yet: in PromQL an operation with an absent series is absent
(an alert that never fires)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from catalog.models import ClusterSettings
from fleet.models import Gpu, ScalingEvent
from gateway.models import ApiKey, Team
from tests.processes import daphne, fake_engine, free_port, wait_for_port, wait_until
from tests.replicas import routed_to, serve

pytestmark = [pytest.mark.django_db(transaction=True)]

DASHBOARD = Path(__file__).resolve().parents[2] / "docs" / "grafana" / "llmgw.json"
README = Path(__file__).resolve().parents[2] / "README.md"
HI = [{"role": "user", "content": "x"}]

#: What PromQL words are besides metric names (functions are followed by "(").
_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool", "offset"}
#: Series of ``/metrics`` that exist only while the situation they measure does: declared
#: on every scrape, sampled once a model's admission queue formed (at its capacity).
_DECLARED_ONLY = {"llmgw_requests_queued"}


def queries(dashboard: dict) -> list[str]:
    """Every PromQL expression of the dashboard: panels' targets and template variables."""
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        query = variable.get("query")
        if variable["type"] == "query":
            text = query["query"] if isinstance(query, dict) else query
            exprs.append(re.sub(r"^label_values\((.*),\s*\w+\)$", r"\1", text))
    return exprs


def readme_alerts() -> dict[str, str]:
    """README's sample alerting rules (its YAML blocks' items with an ``alert``): name → expr."""
    alerts = {}
    for block in re.findall(r"```yaml\n(.*?)```", README.read_text(), flags=re.S):
        for rule in yaml.safe_load(block) or []:
            if isinstance(rule, dict) and "alert" in rule:
                alerts[rule["alert"]] = rule["expr"]
    return alerts


def _without_labels(expr: str) -> str:
    """``expr`` without label values, matchers, ranges and label lists (their parentheses
    and commas are not PromQL's operands)."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # label values
    expr = re.sub(r"\{[^}]*\}", "", expr)  # matchers
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # ranges
    return re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)  # label lists


def metric_names(expr: str) -> set[str]:
    """The metric names in a PromQL expression: identifiers that are not functions, keywords,
    label names (inside ``{}``, after ``by``/``without``) or strings."""
    expr = _without_labels(expr)
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", expr):
        word, rest = match.group(), expr[match.end():].lstrip()
        if rest.startswith("(") or word in _KEYWORDS or re.fullmatch(r"\d.*", word):
            continue
        names.add(word)
    return names


#: PromQL's binary operators that match the series of their two sides one to one (arithmetic
#: and comparison); ``and``, ``or``, ``unless`` and commas separate what they join.
_JOIN = r"==|!=|>=|<=|[-+*/%^<>]"


def joined_operands(expr: str) -> list[list[str]]:
    """The operands that one chain of binary operators (:data:`_JOIN`) joins, for each chain
    of two or more operands naming a metric, at any depth: ``a + b > 0 or c`` is
    ``[["a ", " b "]]`` (the ``0`` and ``c`` join no series). An operand keeps its function
    and parentheses (``sum (x)``); label values, matchers, ranges and label lists are left out."""
    root: list = []
    stack = [root]
    for ch in _without_labels(expr):
        if ch == "(":
            stack[-1].append([])
            stack.append(stack[-1][-1])
        elif ch == ")":
            stack.pop()
        elif stack[-1] and isinstance(stack[-1][-1], str):
            stack[-1][-1] += ch
        else:
            stack[-1].append(ch)

    def text(items: list) -> str:
        return "".join(i if isinstance(i, str) else f"({text(i)})" for i in items)

    found = []

    def visit(items: list) -> None:
        chains: list[list[list]] = [[[]]]  # chains of operands, each a list of items
        for item in items:
            if isinstance(item, list):
                visit(item)
                chains[-1][-1].append(item)
                continue
            for piece in re.split(rf"(,|\b(?:and|or|unless)\b|{_JOIN})", item):
                if piece == "," or piece in ("and", "or", "unless"):
                    chains.append([[]])
                elif re.fullmatch(_JOIN, piece):
                    chains[-1].append([])
                elif piece:
                    chains[-1][-1].append(piece)
        for chain in chains:
            operands = [text(o) for o in chain]
            if sum(1 for o in operands if metric_names(o)) >= 2:
                found.append(operands)

    visit(root)
    return found


def test_joined_operands_are_those_an_operator_matches_series_by_series():
    assert joined_operands("sum by (model) (a) + sum by (model) (b) > 0") == [["sum  (a) ", " sum  (b) ", " 0"]]
    assert joined_operands("sum by (model) (a) > 0 or sum by (model) (b) > 0") == []
    assert joined_operands('max(x{q="a+b"}) / max without (gpu, agent) (y)') == [["max(x) ", " max  (y)"]]
    assert joined_operands("histogram_quantile(0.95, sum by (le) (rate(x[5m]))) > 5") == []
    assert joined_operands("max(a - b) and c") == [["a ", " b"]]


def test_metric_names_are_read_from_promql_without_functions_labels_or_ranges():
    expr = ('histogram_quantile(0.95, sum by (model, le) (rate(llmgw_ttft_bucket{model=~"$model", '
            'status="5.."}[$__rate_interval]))) / max without (gpu) (other_total) and on (agent) x')
    assert metric_names(expr) == {"llmgw_ttft_bucket", "other_total", "x"}


def test_the_dashboard_is_importable_with_the_datasource_as_a_variable():
    dashboard = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    assert panels and all(p["datasource"]["uid"] == "${datasource}" for p in panels)
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
    titles = " | ".join(p["title"] for p in panels)
    for topic in ("Requests/s", "Errors", "first token", "Tokens/s by model", "Tokens/s by team", "held and queued",
                  "Replicas by state", "Outdated", "Crash loops", "GPU utilisation", "GPU memory", "GPU temperature",
                  "heartbeat age"):
        assert topic in titles, topic


@pytest.fixture
def live(tmp_path, make_model, transactional_db):
    """A web process and a fake engine serving model ``plain``; an on-demand model ``cold``
    with nothing to run it (a held request ends at the 1 s cold-start timeout); a team's key."""
    engine_port, web_port = free_port(), free_port()
    engine = fake_engine(engine_port, tmp_path, "--tokens", "6")
    wait_for_port(engine_port)
    settings = ClusterSettings.get_solo()
    settings.cold_start_timeout_s = 1
    settings.save()
    plain = make_model("plain")
    make_model("cold", min_replicas=0, max_replicas=1, on_demand=True)
    replica = serve(plain, engine_port)
    Gpu.objects.create(agent=replica.agent, index=0, memory_total_mib=81559, memory_used_mib=4000,
                       utilisation_pct=42.0, temperature_c=55.0)
    ScalingEvent.objects.create(model=plain, from_replicas=1, to_replicas=2, reason="busy")
    team = Team.objects.create(name="research")
    key, clear = ApiKey.create_key("alice")
    ApiKey.objects.filter(pk=key.pk).update(team=team)
    web = daphne(web_port, tmp_path, env={"LLMGW_WATCH_INTERVAL": "50ms", "LLMGW_USAGE_FLUSH_INTERVAL": "0.2s"})
    url = f"http://127.0.0.1:{web_port}"
    try:
        fresh = httpx.get(f"{url}/metrics", timeout=10).text  # before any request


        def chat(model: str, **extra) -> httpx.Response:
            return httpx.post(f"{url}/v1/chat/completions", json={"model": model, "messages": HI, **extra},
                              headers={"Authorization": f"Bearer {clear}"}, timeout=30)

        wait_until(lambda: routed_to(chat("plain"), replica), timeout_s=20, what="plain to be routed")
        yield {"url": url, "chat": chat, "fresh": fresh}
    finally:
        web.stop()
        engine.stop()


def test_every_query_of_the_dashboard_names_a_metric_a_real_scrape_serves(live):
    for _ in range(3):
        assert live["chat"]("plain").status_code == 200
    assert live["chat"]("plain", stream=True).status_code == 200
    held = live["chat"]("cold")
    assert held.status_code == 503 and held.json()["error"]["code"] == "model_loading"  # held, then timed out
    text = wait_until(lambda: _scrape_with(live["url"], 'llmgw_tokens_total{kind="completion",model="plain",'
                                                        'team="research"}'),
                      timeout_s=20, what="the tokens on /metrics")
    families = list(text_string_to_metric_families(text))
    sampled = {s.name for f in families for s in f.samples}
    declared = set()
    for f in families:
        declared |= {"counter": {f.name + "_total"}, "histogram": {f.name + s for s in ("_bucket", "_sum", "_count")},
                     "gauge": {f.name}}.get(f.type, {f.name})
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [*queries(dashboard), *readme_alerts().values()]
    named = {name: expr for expr in exprs for name in metric_names(expr)}
    assert len(named) >= 20, sorted(named)
    for name, expr in sorted(named.items()):
        assert name in declared, f"{name} (in {expr!r}) is not on /metrics"
        if name not in _DECLARED_ONLY:
            assert name in sampled, f"{name} (in {expr!r}) has no series after requests"
    # The series the requests made carry the labels the panels group by.
    assert re.search(r'llmgw_key_tokens_total\{key="alice",key_prefix="[^"]+",kind="prompt"\}', text), text
    assert 'llmgw_request_hold_seconds_count{model="cold"} 1.0' in text
    assert 'llmgw_gpu_utilisation_ratio{agent="local",gpu="0"} 0.42' in text


def test_no_query_nor_alert_joins_a_series_a_fresh_process_may_not_have(live):
    """``a + b`` is empty while either side is: every operand that an arithmetic or a
    comparison joins to another series must be sampled already by a process that served
    nothing (the fleet's gauges, totals without labels) — a situational series (held,
    queued, requests, tokens…) is joined with ``or``."""
    families = list(text_string_to_metric_families(live["fresh"]))
    always = {s.name for f in families for s in f.samples}
    assert "llmgw_gpu_memory_total_bytes" in always and "llmgw_requests_queued" not in always
    alerts = readme_alerts()
    assert "LlmgwRequestsWaiting" in alerts and "LlmgwDatabaseAway" in alerts
    checked = 0
    for expr in [*queries(json.loads(DASHBOARD.read_text())), *alerts.values()]:
        for operands in joined_operands(expr):
            checked += 1
            for operand in operands:
                absent = metric_names(operand) - always
                assert not absent, (f"{expr!r} joins {operand.strip()!r}, whose {sorted(absent)} a process may not "
                                    "have: the result is then empty; join with `or`")
    assert checked >= 1  # the GPU memory ratio: both sides there for every GPU


def _scrape_with(url: str, line_start: str) -> str | None:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return text if line_start in text else None
