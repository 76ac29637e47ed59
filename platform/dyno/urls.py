from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/v1/", include("api.urls")),
    # Reports and metering own their paths (web under /reports, /billing; API under /api/v1/...).
    path("", include("reports.urls")),
    path("", include("metering.urls")),
    path("", include("front.urls")),
]
