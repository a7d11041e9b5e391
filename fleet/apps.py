from django.apps import AppConfig


class FleetConfig(AppConfig):
    name = "fleet"
    verbose_name = "Fleet"

    def ready(self) -> None:
        from django.db.models.signals import post_migrate

        from fleet.tasks import register_schedules

        # Idempotent (update_or_create) and after migrations, never at import time.
        post_migrate.connect(register_schedules, sender=self)
