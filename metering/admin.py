"""The admin shows metering data read-only: contracts, billing and invoices change only through
the services (billing pages and API), which keep the audit log; the database refuses the rest."""

from __future__ import annotations

from django.contrib import admin

from metering.models import (
    BillingRecord, BillingRun, Contract, CreditNote, CreditNoteLine, Deployment, DeploymentReport, Invoice,
    InvoiceLine, UsageEvent,
)


class ReadOnlyAdmin(admin.ModelAdmin):
    """View only: no add, change or delete, whatever the user's permissions."""

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


class ReadOnlyInline(admin.TabularInline):
    extra = 0
    can_delete = False
    show_change_link = False

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Contract)
class ContractAdmin(ReadOnlyAdmin):
    list_display = ("organization", "version", "effective_from", "effective_to", "revenue_share", "currency",
                    "minimum_speedup", "monthly_cap")
    list_filter = ("currency",)
    search_fields = ("organization__slug",)


class DeploymentReportInline(ReadOnlyInline):
    model = DeploymentReport
    fields = ("report", "effective_from", "created_by")
    readonly_fields = fields


@admin.register(Deployment)
class DeploymentAdmin(ReadOnlyAdmin):
    list_display = ("name", "organization", "hardware", "active_from")
    search_fields = ("name", "organization__slug")
    inlines = [DeploymentReportInline]


@admin.register(UsageEvent)
class UsageEventAdmin(ReadOnlyAdmin):
    list_display = ("idempotency_key", "organization", "deployment", "occurred_at", "gpu_hours", "received_at")
    show_full_result_count = False  # the table is large; counting it on every page is slow
    search_fields = ("idempotency_key",)


@admin.register(BillingRun)
class BillingRunAdmin(ReadOnlyAdmin):
    list_display = ("period", "cutoff", "created_at", "created_by")


@admin.register(BillingRecord)
class BillingRecordAdmin(ReadOnlyAdmin):
    list_display = ("run", "organization", "deployment", "usage_period", "hours", "speedup", "fee", "currency",
                    "reason")
    list_filter = ("kind", "reason", "currency")


class InvoiceLineInline(ReadOnlyInline):
    model = InvoiceLine
    fields = ("position", "kind", "description", "hours", "speedup", "savings", "fee", "reason", "record")
    readonly_fields = fields


@admin.register(Invoice)
class InvoiceAdmin(ReadOnlyAdmin):
    list_display = ("__str__", "organization", "period", "status", "total", "currency", "finalized_at")
    list_filter = ("status", "currency")
    search_fields = ("number", "organization__slug")
    inlines = [InvoiceLineInline]


class CreditNoteLineInline(ReadOnlyInline):
    model = CreditNoteLine
    fields = ("invoice_line", "amount")
    readonly_fields = fields


@admin.register(CreditNote)
class CreditNoteAdmin(ReadOnlyAdmin):
    list_display = ("number", "invoice", "organization", "reason_code", "total", "currency", "created_at")
    inlines = [CreditNoteLineInline]
