"""`manage.py check --deploy`: production has the audit log key it needs to append and verify."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import Error, Tags, register

from auditlog.keys import AuditKeyError, audit_key


@register(Tags.security, deploy=True)
def audit_key_present(app_configs: Any = None, **kwargs: Any) -> list[Error]:
    if not getattr(settings, "PRODUCTION", False):
        return []
    try:
        audit_key(create=False)
    except AuditKeyError as exc:
        return [Error(str(exc), id="auditlog.E001")]
    return []
