from django.apps import AppConfig


class AuditlogConfig(AppConfig):
    name = "auditlog"

    def ready(self) -> None:
        from auditlog import checks  # noqa: F401  (registers the deploy check)
