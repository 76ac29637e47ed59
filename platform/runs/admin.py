from django.contrib import admin

from runs.models import Run, RunEvent, WorkloadResult


class RunEventInline(admin.TabularInline):
    model = RunEvent
    extra = 0
    readonly_fields = ("at", "level", "stage", "message")


class WorkloadResultInline(admin.TabularInline):
    """Shown, never edited: the rows are stored once with the run's result (the database refuses
    any change, see runs/migrations/0004_immutable_results.py)."""

    model = WorkloadResult
    extra = 0
    can_delete = False
    fields = ("name", "shape", "verdict", "speedup", "ci_low", "ci_high", "weight", "is_model")
    readonly_fields = fields

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    list_display = ("id", "organization", "hardware", "status", "stage", "progress", "worker", "created_at")
    list_filter = ("status", "hardware")
    inlines = [WorkloadResultInline, RunEventInline]

    # Runs are created through the platform (upload, API) and written by the workers; a stored
    # result is final. Staff read them here and change nothing.
    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return obj is not None and obj.result is None and obj.finished
