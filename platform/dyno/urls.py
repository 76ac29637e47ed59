from django.contrib import admin
from django.urls import include, path, re_path

from api import errors
from api.app import api
from fleet.metrics import metrics

urlpatterns = [
    path("admin/", admin.site.urls),
    path("metrics", metrics, name="metrics"),
    path("api/v1/", api.urls),
    # Runner hosts (no database credentials) report here with their runner key.
    path("runner/v1/", include(("fleet.control_api", "control"))),
    # Reports and metering own their paths (web under /reports, /billing; API under /api/v1/...).
    path("", include("reports.urls")),
    path("", include("metering.urls")),
    path("", include("front.urls")),
    # Last: any other path under /api/ (a non-UUID id included) answers with the JSON contract.
    re_path(r"^api/", errors.unknown_endpoint),
]

# Under /api/ these answer JSON ({"error": {"code", "message"}}); elsewhere Django's HTML pages.
handler400 = errors.bad_request
handler403 = errors.permission_denied
handler404 = errors.page_not_found
handler500 = errors.server_error
