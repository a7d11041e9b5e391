import logging

from django.apps import AppConfig
from django.conf import settings
from django.db.models.signals import post_migrate


class LlmgwConfig(AppConfig):
    name = "llmgw"
    verbose_name = "llmgw"

    def ready(self) -> None:
        for note in getattr(settings, "DATA_DIR_TIGHTENED", []):
            logging.getLogger("llmgw.datadir").warning(
                "data directory was readable by others; tightened %s", note)

        # lazy: Django imports apps.py while the app registry loads; the checks and the
        # retention task import models, which load only once it is ready.
        from llmgw import checks  # noqa: F401  (registers the system checks)
        from llmgw.retention import register_schedule

        # Idempotent (update_or_create) and after migrations, never at import time. This
        # app has no models, so Django sends it no post_migrate: hang on fleet's.
        post_migrate.connect(register_schedule, sender=self.apps.get_app_config("fleet"))
