"""Web pages of reports: list, report page with charts, downloads (JSON, signature, PDF),
side-by-side comparison, dispute and re-audit forms, the public verify page and keys document.
"""

from __future__ import annotations

import io
import json
import uuid
from pathlib import Path

import plotly
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import FileResponse, Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.template.loader import render_to_string
from django.utils import timezone
from django.utils.safestring import mark_safe
from django.views.decorators.csrf import csrf_exempt, csrf_protect
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from accounts.models import Role
from accounts.selectors import Actor, actor_for_user
from api.bounded import content_length
from api.pagination import html_page
from reports.compare import compare_bodies
from reports.models import Report
from reports.presentation import report_view, speedup_svg
from reports.selectors import (
    VERIFY_FILE_MAX_BYTES,
    files_verify,
    reaudit_neighbours,
    reaudit_open_for,
    report_auditors,
    report_get,
    report_list,
    report_successor,
    report_verify,
    signature_document,
)
from reports.services import (
    DISPUTING_ROLES,
    ReportRefused,
    dispute_deadline,
    reaudit_request,
    reaudits_counted,
    report_dispute,
)
from reports.signing import keys_document

# Both files of /verify and the form around them (field names, boundaries, the CSRF token).
VERIFY_REQUEST_MAX_BYTES = 2 * VERIFY_FILE_MAX_BYTES + 64 * 1024
PLOTLY_JS = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
KEYS_CACHE_SECONDS = 300  # short: a revocation must reach verifiers quickly


def _actor(request: HttpRequest) -> Actor:
    return actor_for_user(request.user)


def _body(report: Report) -> dict:
    return json.loads(report.body_bytes)


def _filename(report: Report, suffix: str) -> str:
    return f"dyno-report-{str(report.pk)[:8]}{suffix}"


@login_required
def report_list_page(request: HttpRequest) -> HttpResponse:
    actor = _actor(request)
    pager = html_page(request, report_list(actor=actor))
    listed = pager.rows
    superseded = set(Report.objects.filter(supersedes__in=listed).values_list("supersedes_id", flat=True))
    return render(request, "reports/report_list.html", {
        "reports": [(r, r.pk in superseded) for r in listed], "pager": pager,
        "many_orgs": actor.is_staff or len(actor.org_ids) > 1,
    })


def reaudit_comparisons(report: Report) -> list[dict]:
    """This report beside what it re-audited, and beside the re-audit that superseded it."""
    original, reaudit = reaudit_neighbours(report)
    pairs = ([(original, report)] if original else []) + ([(report, reaudit)] if reaudit else [])
    return [{"original": old, "reaudit": new, "comparison": compare_bodies(_body(old), _body(new))}
            for old, new in pairs]


def _page_context(actor: Actor, report: Report) -> dict:
    role = actor.role_in(report.organization_id)
    view = report_view(_body(report))
    return {
        "report": report, "view": view, "summary": view.summary,
        "verification": report_verify(report=report),
        "successor": report_successor(report),
        "reaudit_comparisons": reaudit_comparisons(report),
        "reaudit_open": reaudit_open_for(report),
        "disputes": report.disputes.all(),
        "auditors": report_auditors(report),
        "reaudits_used": reaudits_counted(organization_id=report.organization_id)[:2],
        "can_reaudit": actor.is_staff or role == Role.AUDITOR,
        "can_dispute": role in DISPUTING_ROLES,
        "dispute_deadline": dispute_deadline(report),
        "dispute_window_open": timezone.now() <= dispute_deadline(report),
        "others": report_list(actor=actor).filter(organization_id=report.organization_id).exclude(pk=report.pk)[:50],
        "plotly_version": plotly.__version__,
    }


@login_required
def report_detail(request: HttpRequest, report_id) -> HttpResponse:
    actor = _actor(request)
    report = report_get(actor=actor, report_id=report_id)
    return render(request, "reports/report_detail.html", _page_context(actor, report))


@login_required
def report_json(request: HttpRequest, report_id) -> HttpResponse:
    """The body exactly as signed: these bytes, not a re-serialization, are what verifies."""
    report = report_get(actor=_actor(request), report_id=report_id)
    response = HttpResponse(report.body_bytes, content_type="application/json")
    response["Content-Disposition"] = f'attachment; filename="{_filename(report, ".json")}"'
    return response


@login_required
def report_signature(request: HttpRequest, report_id) -> HttpResponse:
    report = report_get(actor=_actor(request), report_id=report_id)
    response = JsonResponse(signature_document(report))
    response["Content-Disposition"] = f'attachment; filename="{_filename(report, ".sig.json")}"'
    return response


@login_required
def report_pdf(request: HttpRequest, report_id) -> HttpResponse:
    from weasyprint import HTML, Attachment
    from weasyprint.urls import URLFetcher

    actor = _actor(request)
    report = report_get(actor=actor, report_id=report_id)
    context = _page_context(actor, report)
    context["speedup_svg"] = mark_safe(speedup_svg(context["view"].rows))  # built with html.escape
    html = render_to_string("reports/report_pdf.html", context, request=request)
    # The PDF fetches nothing: everything it shows is inline, so a crafted string cannot read files.
    fetcher = URLFetcher(allowed_protocols=("data",))
    signature = json.dumps(signature_document(report)).encode()
    pdf = HTML(string=html, url_fetcher=fetcher).write_pdf(attachments=[
        Attachment(file_obj=io.BytesIO(report.body_bytes), name=_filename(report, ".json"),
                   description="the signed report body, byte for byte", url_fetcher=fetcher),
        Attachment(file_obj=io.BytesIO(signature), name=_filename(report, ".sig.json"),
                   description="its detached Ed25519 signature", url_fetcher=fetcher),
    ])
    response = HttpResponse(pdf, content_type="application/pdf")
    response["Content-Disposition"] = f'attachment; filename="{_filename(report, ".pdf")}"'
    return response


@login_required
@require_POST
def report_reaudit(request: HttpRequest, report_id) -> HttpResponse:
    actor = _actor(request)
    report = report_get(actor=actor, report_id=report_id)
    try:
        reaudit_request(actor=actor, report=report, reason=request.POST.get("reason", ""))
        messages.success(request, "Re-audit requested; the new report will supersede this one.")
    except ReportRefused as exc:
        messages.error(request, str(exc))
    return redirect("reports:detail", report_id=report.pk)


@login_required
@require_POST
def report_dispute_view(request: HttpRequest, report_id) -> HttpResponse:
    actor = _actor(request)
    report = report_get(actor=actor, report_id=report_id)
    try:
        report_dispute(actor=actor, report=report, reason=request.POST.get("reason", ""))
        messages.success(request, "Dispute recorded; a re-audit is requested and its report will answer it.")
    except ReportRefused as exc:
        messages.error(request, str(exc))
    return redirect("reports:detail", report_id=report.pk)


@login_required
def report_compare(request: HttpRequest) -> HttpResponse:
    actor = _actor(request)
    try:
        ids = [uuid.UUID(request.GET.get(name, "")) for name in ("a", "b")]
    except ValueError:
        raise Http404("No such report.") from None  # a malformed id is as unknown as a missing one
    chosen = [report_get(actor=actor, report_id=i) for i in ids]
    old, new = sorted(chosen, key=lambda r: r.created_at)
    return render(request, "reports/compare.html", {
        "old": old, "new": new, "comparison": compare_bodies(_body(old), _body(new)),
        "old_view": report_view(_body(old)).summary, "new_view": report_view(_body(new)).summary,
    })


def _verify_render(request: HttpRequest, *, result=None, error: str = "", status: int = 200) -> HttpResponse:
    return render(request, "reports/verify.html", {"result": result, "error": error}, status=status)


# Exempt here only to look at the declared size first: the CSRF check reads the whole form, files
# included. `_verify_form` is CSRF-protected as before.
@csrf_exempt
@require_http_methods(["GET", "POST"])
def verify_page(request: HttpRequest) -> HttpResponse:
    """Anyone may check a report file and its signature file against the published keys. A request
    larger than two files of VERIFY_FILE_MAX_BYTES is refused (413) before its body is read."""
    declared = content_length(request.META)
    if request.method == "POST" and declared is not None and declared > VERIFY_REQUEST_MAX_BYTES:
        return _verify_render(request, status=413, error=(
            f"These files are {declared:,} bytes together; a Dyno report and its signature file are at most "
            f"{VERIFY_FILE_MAX_BYTES // 2**20} MiB each. Choose the .json and .sig.json files downloaded from "
            "the report page."))
    return _verify_form(request)


@csrf_protect
def _verify_form(request: HttpRequest) -> HttpResponse:
    if request.method != "POST":
        return _verify_render(request)
    body_file, signature_file = request.FILES.get("report"), request.FILES.get("signature")
    if body_file is None or signature_file is None:
        return _verify_render(request, status=400,
                              error="Choose both files: the report (.json) and its signature (.sig.json).")
    for label, upload in (("report", body_file), ("signature", signature_file)):
        if upload.size > VERIFY_FILE_MAX_BYTES:
            return _verify_render(request, status=413, error=(
                f"The {label} file is {upload.size:,} bytes; a Dyno {label} file is at most "
                f"{VERIFY_FILE_MAX_BYTES // 2**20} MiB. Choose the file downloaded from the report page."))
    result = files_verify(body=body_file.read(), signature=signature_file.read())
    return _verify_render(request, result=result, status=200 if result.valid else 422)


@require_GET
def keys_json(request: HttpRequest) -> JsonResponse:
    response = JsonResponse(keys_document())
    response["Cache-Control"] = f"public, max-age={KEYS_CACHE_SECONDS}"
    response["Access-Control-Allow-Origin"] = "*"
    return response


@require_GET
def plotly_js(request: HttpRequest, version: str) -> FileResponse:
    """plotly.js from the installed plotly package (no CDN, nothing vendored in the repository).

    The version is in the URL, so browsers may cache it for good.
    """
    if version != plotly.__version__:
        raise Http404("No such plotly version.")
    response = FileResponse(open(PLOTLY_JS, "rb"), content_type="text/javascript")
    response["Cache-Control"] = "public, max-age=31536000, immutable"
    return response

