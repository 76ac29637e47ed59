from django.contrib import admin

from fleet.models import Runner


@admin.register(Runner)
class RunnerAdmin(admin.ModelAdmin):
    list_display = ("hostname", "hardware", "last_heartbeat", "stopped_at")
    readonly_fields = ("fingerprint", "fingerprint_sha256")
