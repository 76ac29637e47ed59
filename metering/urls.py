"""URLs of the metering app: pages under /billing/, API endpoints under /api/v1/."""

from django.urls import path

from metering import api, views

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
    path("api/v1/contracts", api.contracts, name="api-contracts"),
    path("api/v1/contracts/<uuid:contract_id>", api.contract_detail, name="api-contract"),
    path("api/v1/deployments", api.deployments, name="api-deployments"),
    path("api/v1/deployments/<uuid:deployment_id>", api.deployment_detail, name="api-deployment"),
    path("api/v1/deployments/<uuid:deployment_id>/reports", api.deployment_reports, name="api-deployment-reports"),
    path("api/v1/usage/batch", api.usage_batch, name="api-usage-batch"),
    path("api/v1/billing-runs", api.billing_runs, name="api-billing-runs"),
    path("api/v1/billing-runs/<uuid:run_id>", api.billing_run_detail, name="api-billing-run"),
    path("api/v1/invoices", api.invoices, name="api-invoices"),
    path("api/v1/invoices/<uuid:invoice_id>", api.invoice_detail, name="api-invoice"),
    path("api/v1/invoices/<uuid:invoice_id>/finalize", api.invoice_finalize_view, name="api-invoice-finalize"),
    path("api/v1/invoices/<uuid:invoice_id>/void", api.invoice_void_view, name="api-invoice-void"),
    path("api/v1/invoices/<uuid:invoice_id>/reissue", api.invoice_reissue_view, name="api-invoice-reissue"),
    path("api/v1/invoices/<uuid:invoice_id>/credit-notes", api.invoice_credit_notes, name="api-invoice-credit-notes"),
    path("api/v1/invoices/<uuid:invoice_id>/export", api.invoice_export_view, name="api-invoice-export"),
    path("api/v1/exports/revenue-share", api.revenue_share_view, name="api-revenue-share"),
    path("api/v1/invoices/preview", api.invoice_preview_view, name="api-invoice-preview"),
]
