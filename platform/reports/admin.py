"""Read-only admin for reports and keys: signed rows are changed by services (or never), not by hand."""

from django.contrib import admin

from reports.models import Dispute, ReauditRequest, Report, SigningKey


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Report)
class ReportAdmin(ReadOnlyAdmin):
    list_display = ("id", "organization", "kind", "hardware", "model_speedup", "model_ci_low", "stable",
                    "key_id", "created_at")
    list_filter = ("kind", "stable", "hardware")
    exclude = ("body",)  # the body is served at /reports/<id>/report.json, byte for byte


@admin.register(SigningKey)
class SigningKeyAdmin(ReadOnlyAdmin):
    list_display = ("key_id", "status", "created_at", "retired_at", "revoked_at")


@admin.register(ReauditRequest)
class ReauditRequestAdmin(ReadOnlyAdmin):
    list_display = ("id", "organization", "report", "status", "requested_by", "created_at")
    list_filter = ("status",)


@admin.register(Dispute)
class DisputeAdmin(ReadOnlyAdmin):
    list_display = ("id", "organization", "report", "status", "raised_by", "created_at")
    list_filter = ("status",)
