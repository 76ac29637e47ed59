from django.contrib import admin

from accounts.models import ApiKey, Membership, Organization


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0


@admin.register(Organization)
class OrganizationAdmin(admin.ModelAdmin):
    list_display = ("slug", "name", "created_at")
    inlines = [MembershipInline]


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ("name", "organization", "scope", "prefix", "created_at", "last_used_at", "revoked_at")
    # The digest is useless to a reader and the plaintext is never stored: nothing here is editable.
    readonly_fields = ("organization", "name", "scope", "prefix", "digest", "created_by", "created_at",
                       "last_used_at")
    exclude = ()

    def has_add_permission(self, request) -> bool:
        return False  # keys are created with `create_api_key` or on the API keys page, shown once
