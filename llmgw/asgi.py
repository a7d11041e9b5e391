"""ASGI entry point: HTTP to Django (static files served for the admin), websockets at
``/ws/agent/`` to the agents' consumer."""

import os

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw.settings")

from django.core.asgi import get_asgi_application  # noqa: E402

django_asgi = get_asgi_application()

from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402
from django.urls import path  # noqa: E402

from fleet.consumers import AgentConsumer  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": ASGIStaticFilesHandler(django_asgi),
        "websocket": URLRouter([path("ws/agent/", AgentConsumer.as_asgi())]),
    }
)
