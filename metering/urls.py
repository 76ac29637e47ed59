"""URLs of the metering app: pages under /billing/ (its API endpoints under /api/v1/ are the ninja
router of metering/api.py, mounted by api/app.py)."""

from django.urls import path

from metering import views

app_name = "metering"

urlpatterns = [
    path("billing/", views.invoices, name="invoices"),
    path("billing/invoices/<uuid:invoice_id>", views.invoice_detail, name="invoice"),
    path("billing/invoices/<uuid:invoice_id>/finalize", views.invoice_finalize_view, name="invoice-finalize"),
    path("billing/invoices/<uuid:invoice_id>/void", views.invoice_void_view, name="invoice-void"),
    path("billing/invoices/<uuid:invoice_id>/reissue", views.invoice_reissue_view, name="invoice-reissue"),
    path("billing/invoices/<uuid:invoice_id>/credit-notes", views.invoice_credit_view, name="invoice-credit"),
    path("billing/invoices/<uuid:invoice_id>/export.<str:fmt>", views.invoice_download, name="invoice-download"),
    path("billing/runs", views.runs, name="runs"),
    path("billing/runs/<uuid:run_id>", views.run_detail, name="run"),
    path("billing/contracts", views.contracts, name="contracts"),
    path("billing/deployments", views.deployments, name="deployments"),
    path("billing/revenue", views.revenue, name="revenue"),
    path("billing/revenue-share.<str:fmt>", views.revenue_share_download, name="revenue-share"),
    path("billing/savings", views.savings, name="savings"),
]
