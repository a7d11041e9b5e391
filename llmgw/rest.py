"""What every REST API serializer that writes shares: a field the API does not know is an
error, never silently dropped (a key created with ``"models": [...]`` instead of
``"allowed_models"`` would otherwise be a key for every model)."""

from __future__ import annotations

from rest_framework import serializers


class RefuseUnknownFields:
    """Mixin for a DRF serializer: input naming a field the serializer does not have
    answers 400 with ``{"<name>": ["Unknown field: the fields are a, b, c."]}``. Read-only
    fields are known (a client may send back what it read); only dict input is checked."""

    def to_internal_value(self, data):
        if isinstance(data, dict) or hasattr(data, "keys"):
            unknown = sorted(set(data.keys()) - set(self.fields))
            if unknown:
                writable = ", ".join(sorted(n for n, f in self.fields.items() if not f.read_only))
                raise serializers.ValidationError(
                    {name: [f"Unknown field: the fields are {writable}."] for name in unknown})
        return super().to_internal_value(data)
