from django.apps import AppConfig


class LlmgwConfig(AppConfig):
    name = "llmgw"
    verbose_name = "llmgw"

    def ready(self) -> None:
        from llmgw import checks  # noqa: F401  (registers the system checks)
