from django.apps import AppConfig


class AuditlogConfig(AppConfig):
    name = "auditlog"
