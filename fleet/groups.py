"""Where an agent's websocket can be reached from any process: its channel-layer group, and
the three messages the control plane sends there.

An agent's consumer joins ``agent_group(id)`` in whichever web process holds its socket. The
worker nudges it after a pass (``agent.assign``: send the desired set now), the operator's
restart asks it to restart in place (``agent.restart``), and the models close it when its
token is re-keyed or its row deleted (``agent.revoked``). All three are shortcuts over a
shared layer (Redis); without one, the watcher notices the generation moves within a tick
and the consumer's token re-check closes a revoked socket (docs/architecture.md, "Crossing
processes"). Nothing here touches the database, so the
models can call it and every role can import it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.conf import settings

log = logging.getLogger(__name__)


def agent_group(agent_id: int) -> str:
    """The channel-layer group of one agent's websocket (one member: its consumer)."""
    return f"agent.{agent_id}"


def _tell(agent_ids: Iterable[int], event_type: str) -> None:
    """Send ``event_type`` to each agent's group over a shared layer (Redis); nothing
    without one. Never raises: the watcher delivers anyway (by generation)."""
    if not settings.REDIS_URL:
        return
    layer = get_channel_layer()
    for agent_id in agent_ids:
        try:
            async_to_sync(layer.group_send)(agent_group(agent_id), {"type": event_type})
        except Exception:
            log.warning("could not send %s to agent %s over the channel layer", event_type, agent_id, exc_info=True)


def nudge_agents(agent_ids: Iterable[int]) -> None:
    """With a shared channel layer (Redis), deliver the new desired sets at once; without
    one the web processes' watchers notice the generation move within a tick."""
    _tell(agent_ids, "agent.assign")


def restart_agents(agent_ids: Iterable[int]) -> None:
    """With a shared channel layer, ask these agents to restart in place at once; without
    one the watchers deliver it when they see ``restart_generation`` move."""
    _tell(agent_ids, "agent.restart")


def revoke_sessions(agent_id: int) -> None:
    """Close the live websocket of agent ``agent_id`` now, in whichever web process holds
    it: an ``agent.revoked`` event to its group. Call from sync code after the re-key or
    delete is committed (``Agent.rekey``, the ``post_delete`` signal). Reaches other
    processes only over a shared layer (Redis); otherwise the consumer's token re-check on
    heartbeats (``LLMGW_AGENT_TOKEN_RECHECK``) closes it. Never raises: a layer that is
    away must not fail the re-key itself."""
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        async_to_sync(layer.group_send)(agent_group(agent_id), {"type": "agent.revoked"})
    except Exception:
        log.warning("could not tell the web processes that agent %s was revoked; its token re-check closes "
                    "its websocket within LLMGW_AGENT_TOKEN_RECHECK", agent_id, exc_info=True)
