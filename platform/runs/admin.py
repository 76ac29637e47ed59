from django.contrib import admin

from runs.models import Run, RunEvent


class RunEventInline(admin.TabularInline):
    model = RunEvent
    extra = 0
    readonly_fields = ("at", "level", "stage", "message")


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    list_display = ("id", "organization", "hardware", "status", "stage", "progress", "worker", "created_at")
    list_filter = ("status", "hardware")
    readonly_fields = ("status", "stage", "progress", "worker", "heartbeat_at", "attempts", "inventory")
    inlines = [RunEventInline]
