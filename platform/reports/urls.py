"""URLs of the reports app: web pages under /reports/, the public keys document under /.well-known/
and the public verify page at /verify. The API under /api/v1/reports is reports/api.router, mounted
in the API application (api/app.py), its names in the `api` namespace.
"""

from django.urls import path

from reports import views

app_name = "reports"

urlpatterns = [
    path("reports/", views.report_list_page, name="list"),
    path("reports/compare", views.report_compare, name="compare"),
    path("reports/assets/plotly-<str:version>.min.js", views.plotly_js, name="plotly-js"),
    path("reports/<uuid:report_id>", views.report_detail, name="detail"),
    path("reports/<uuid:report_id>/report.json", views.report_json, name="download-json"),
    path("reports/<uuid:report_id>/signature.json", views.report_signature, name="download-signature"),
    path("reports/<uuid:report_id>/report.pdf", views.report_pdf, name="download-pdf"),
    path("reports/<uuid:report_id>/reaudit", views.report_reaudit, name="reaudit"),
    path("reports/<uuid:report_id>/dispute", views.report_dispute_view, name="dispute"),
    path("verify", views.verify_page, name="verify"),
    path(".well-known/dyno-report-keys.json", views.keys_json, name="keys"),
]
