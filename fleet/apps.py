from django.apps import AppConfig
from django.contrib.auth import get_user_model
from django.db.models.signals import post_migrate, post_save


class FleetConfig(AppConfig):
    name = "fleet"
    verbose_name = "Fleet"

    def ready(self) -> None:
        # lazy: Django imports apps.py while the app registry loads; models (which these
        # import) only load once it is ready.
        from fleet.ops import metrics
        from fleet.tasks import register_schedules

        metrics.register()

        # Idempotent (update_or_create) and after migrations, never at import time.
        post_migrate.connect(register_schedules, sender=self)
        post_save.connect(revoke_tokens_on_password_change, sender=get_user_model(),
                          dispatch_uid="llmgw-revoke-api-tokens-on-password-change")


def revoke_tokens_on_password_change(sender, instance, created, **kwargs) -> None:
    """A new password ends the user's REST API tokens, as it ends their sessions: a token
    taken with the old password must not outlive it. ``set_password`` leaves the clear
    password on the user until it is saved (``_password``); Django's own rehash of an
    unchanged password at login clears it first, so that keeps the tokens."""
    if not created and getattr(instance, "_password", None) is not None:
        from fleet.models import ApiToken  # lazy: apps.py loads before the models can

        ApiToken.objects.filter(user=instance).delete()
