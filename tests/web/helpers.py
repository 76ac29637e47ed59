"""Small builders shared by the web tests."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

from django.core.files.uploadedfile import SimpleUploadedFile


def folder_uploads(folder: Path, prefix: str = "") -> list[SimpleUploadedFile]:
    return [SimpleUploadedFile(prefix + p.name, p.read_bytes()) for p in sorted(folder.iterdir()) if p.is_file()]


def zip_of(folder: Path, *, top: str | None = "model") -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for path in sorted(folder.iterdir()):
            archive.write(path, f"{top}/{path.name}" if top else path.name)
    return buffer.getvalue()


def upload_version(*, org, folder: Path, name: str = "tiny", actor=None):
    from accounts.selectors import Actor
    from catalog.services import NamedUpload, model_version_upload

    actor = actor or Actor(roles={org.pk: "owner"})
    uploads = [NamedUpload(path=f.name, file=f) for f in folder_uploads(folder)]
    return model_version_upload(actor=actor, organization=org, model_name=name, uploads=uploads)
