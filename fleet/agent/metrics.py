"""Reading an engine's own load from its Prometheus metrics endpoint.

A metric that is missing, unparsable or unreachable is *unknown* (None), never 0
(docs/architecture.md, R7, and "Decisions": unknown is not zero).
"""

from __future__ import annotations

import httpx


def parse_metric(text: str, name: str) -> int | None:
    """Sum of every sample of ``name`` (any labels) in Prometheus text, or None if absent
    or unparsable."""
    if not name:
        return None
    total, found = 0.0, False
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        metric, _, rest = line.partition(" ")
        base = metric.split("{", 1)[0]
        if base != name:
            continue
        if "{" in metric and "}" not in metric:
            metric, _, rest = line.partition("} ")
        value = rest.strip().split(" ")[0] if rest.strip() else ""
        try:
            total += float(value)
        except ValueError:
            return None
        found = True
    return int(round(total)) if found else None


async def read_load(client: httpx.AsyncClient, url: str, running_name: str, waiting_name: str,
                    headers: dict[str, str] | None = None) -> tuple[int | None, int | None]:
    """(running, waiting) requests at the engine; each None when unknown (a refusal, such
    as a 401 for a missing engine key, included). ``headers``: the replica's engine key."""
    try:
        response = await client.get(url, headers=headers)
    except httpx.HTTPError:
        return None, None
    if response.status_code != 200:
        return None, None
    return parse_metric(response.text, running_name), parse_metric(response.text, waiting_name)
