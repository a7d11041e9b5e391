"""Wanting a model: the gateway's way to ask for an on-demand replica now."""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from fleet.models import ModelState
from fleet.control.reconciler import request_pass


def want(model_id: int) -> None:
    """Mark the model wanted now, forget a failed placement (the pass this triggers decides
    afresh) and request a pass at once, after commit."""
    now = timezone.now()
    with transaction.atomic():
        state, _ = ModelState.objects.get_or_create(model_id=model_id)
        state.wanted_at = now
        fields = ["wanted_at"]
        if state.unservable:
            state.unservable = False
            state.reason = "wanted: placing"
            fields += ["unservable", "reason"]
        state.save(update_fields=fields)
        request_pass()
