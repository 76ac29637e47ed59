"""The invoice PDF fetches nothing, as the report PDF: a URL that reached its HTML (a customer's
text, a template slip) cannot make WeasyPrint read a file of this host or call another."""

from __future__ import annotations

import pytest
from PIL import Image

pytestmark = pytest.mark.django_db


def test_it_fetches_no_file_url_into_the_invoice_pdf(billed, monkeypatch, tmp_path):
    from weasyprint import HTML

    from metering import exports

    secret = tmp_path / "host-file.png"
    Image.new("RGB", (4, 4), (255, 0, 0)).save(secret)
    image = f'<img src="file://{secret}">'
    planted = image + '<link rel="stylesheet" href="http://127.0.0.1:9/x.css">'
    render = exports.render_to_string
    monkeypatch.setattr(exports, "render_to_string", lambda *a, **k: render(*a, **k) + planted)

    pdf = exports.invoice_pdf(billed["acme"])
    assert pdf.startswith(b"%PDF-") and b"/Image" not in pdf
    # The same page through WeasyPrint's default fetcher would have embedded the host's file.
    assert b"/Image" in HTML(string=image).write_pdf()
