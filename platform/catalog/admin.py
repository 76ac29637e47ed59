from django.contrib import admin

from catalog.models import Model, ModelFile, ModelVersion


class ModelFileInline(admin.TabularInline):
    model = ModelFile
    extra = 0
    readonly_fields = ("path", "size", "sha256")
    can_delete = False


@admin.register(Model)
class ModelAdmin(admin.ModelAdmin):
    list_display = ("name", "organization", "created_at")


@admin.register(ModelVersion)
class ModelVersionAdmin(admin.ModelAdmin):
    list_display = ("__str__", "kind", "family", "architecture", "parameter_count", "created_at")
    readonly_fields = ("model", "number", "kind", "family", "architecture", "parameter_count", "dtype",
                       "config", "storage_dir", "total_bytes", "uploaded_by")
    inlines = [ModelFileInline]
