from django.urls import path

from front import views

app_name = "front"

urlpatterns = [
    path("", views.dashboard, name="dashboard"),
    path("signin", views.signin, name="signin"),
    path("signout", views.signout, name="signout"),
    path("models/", views.models, name="models"),
    path("models/upload", views.upload, name="upload"),
    path("models/<uuid:model_id>", views.model_detail, name="model-detail"),
    path("versions/<uuid:version_id>", views.version_detail, name="version-detail"),
    path("versions/<uuid:version_id>/runs", views.run_create, name="run-create"),
    path("runs/", views.runs, name="runs"),
    path("runs/<uuid:run_id>", views.run_detail, name="run-detail"),
    path("runs/<uuid:run_id>/status", views.run_status, name="run-status"),
    path("runs/<uuid:run_id>/cancel", views.run_cancel_view, name="run-cancel"),
    path("runs/<uuid:run_id>/result.json", views.run_result, name="run-result"),
    path("runs/<uuid:run_id>/artifact.json", views.run_artifact, name="run-artifact"),
    path("runs/<uuid:run_id>/candidate.py", views.run_candidate, name="run-candidate"),
    path("audits/new", views.audit_new, name="audit-new"),
    path("fleet", views.fleet, name="fleet"),
    path("settings/api-keys", views.api_keys, name="api-keys"),
]
