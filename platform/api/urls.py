from django.urls import path

from api import views

app_name = "api"

urlpatterns = [
    path("openapi.json", views.openapi, name="openapi"),
    path("models", views.models, name="models"),
    path("models/<uuid:model_id>", views.model_detail, name="model-detail"),
    path("model-versions/<uuid:version_id>", views.model_version_detail, name="model-version-detail"),
    path("runs", views.runs, name="runs"),
    path("runs/<uuid:run_id>", views.run_detail, name="run-detail"),
    path("runs/<uuid:run_id>/cancel", views.run_cancel_view, name="run-cancel"),
    path("audits", views.audits, name="audits"),
    path("audits/<uuid:run_id>", views.run_detail, name="audit-detail"),
]
