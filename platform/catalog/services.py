"""Model uploads: stage, validate, hash and record a version, or keep nothing at all.

Validation itself lives in catalog/validation.py (pure); this module owns disk and database.
"""

from __future__ import annotations

import logging
import shutil
import uuid
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Iterable, Protocol

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Max
from django.utils import timezone

from accounts.models import Organization
from accounts.selectors import Actor
from accounts.throttle import QuotaExceeded, wait_phrase, window_bounds, window_take, window_used
from auditlog.services import audit_record
from catalog.models import Model, ModelFile, ModelVersion
from catalog.validation import (
    RejectCode,
    UploadLimits,
    UploadRejected,
    check_filenames,
    extract_zip,
    validate_model_dir,
)

log = logging.getLogger(__name__)


class Upload(Protocol):
    """What Django's UploadedFile offers and the service needs."""

    name: str
    size: int

    def chunks(self, chunk_size: int | None = None) -> Iterable[bytes]: ...


@dataclass(frozen=True)
class NamedUpload:
    """An upload with the relative path the client gave it (folder uploads keep their layout)."""

    path: str
    file: Upload


def upload_limits() -> UploadLimits:
    return UploadLimits(
        max_file_bytes=settings.DYNO_UPLOAD_MAX_FILE_BYTES,
        max_total_bytes=settings.DYNO_UPLOAD_MAX_TOTAL_BYTES,
        max_files=settings.DYNO_UPLOAD_MAX_FILES,
        max_zip_ratio=200.0,
        max_zip_entries=settings.DYNO_UPLOAD_MAX_FILES,
        max_card_parameters=settings.DYNO_CARD_MAX_PARAMETERS,
        build_seconds=settings.DYNO_MODEL_BUILD_SECONDS,
        build_memory_bytes=settings.DYNO_MODEL_BUILD_MEMORY_BYTES,
    )


_DAY_SECONDS = 86400


def _upload_quota_key(organization_id: int) -> str:
    return f"upload-bytes:org:{organization_id}"


def _upload_quota_refusal(*, organization_id: int, nbytes: int) -> QuotaExceeded:
    limit = settings.DYNO_QUOTA_UPLOAD_BYTES_PER_DAY
    used = window_used(key=_upload_quota_key(organization_id), seconds=_DAY_SECONDS)
    wait = (window_bounds(seconds=_DAY_SECONDS)[1] - timezone.now()).total_seconds()
    return QuotaExceeded(
        f"This upload ({nbytes:,} bytes) would pass your organization's upload quota of {limit:,} bytes a "
        f"day (UTC): {used:,} bytes were received today, accepted or not. Try again {wait_phrase(wait)}, "
        "or ask Dyno's operators for a larger quota.", retry_after=wait)


def upload_quota_check(*, organization_id: int, nbytes: int, slack: int = 0) -> None:
    """Refuse (QuotaExceeded) an upload of `nbytes` that today's quota cannot hold, give or take
    `slack`; counts nothing. dyno.guards asks this from a request's Content-Length, unread."""
    used = window_used(key=_upload_quota_key(organization_id), seconds=_DAY_SECONDS)
    if used + max(nbytes - slack, 1) > settings.DYNO_QUOTA_UPLOAD_BYTES_PER_DAY:
        raise _upload_quota_refusal(organization_id=organization_id, nbytes=nbytes)


def upload_quota_charge(*, organization_id: int, uploads: list[NamedUpload]) -> None:
    """Count an upload's bytes against the organization's quota for the UTC day, accepted or not
    (received bytes cost bandwidth, disk and hashing either way); a refused one counts nothing."""
    nbytes = sum(upload.file.size for upload in uploads)
    if window_take(key=_upload_quota_key(organization_id), amount=nbytes,
                   limit=settings.DYNO_QUOTA_UPLOAD_BYTES_PER_DAY, seconds=_DAY_SECONDS) is not None:
        raise _upload_quota_refusal(organization_id=organization_id, nbytes=nbytes)


def _normalise_name(raw: str) -> str:
    # Browsers send "folder/config.json" for folder uploads; a single folder level is unwrapped.
    parts = [p for p in PurePosixPath(raw.replace("\\", "/")).parts if p not in ("", ".")]
    return "/".join(parts)


def _unwrap_common_folder(names: list[str]) -> list[str]:
    tops = {n.split("/", 1)[0] for n in names}
    if len(tops) == 1 and all("/" in n for n in names):
        return [n.split("/", 1)[1] for n in names]
    return names


def _stage(uploads: list[NamedUpload], staging: Path, limits: UploadLimits) -> None:
    if not uploads:
        raise UploadRejected("empty", "No files were uploaded: choose a model folder (config.json plus "
                                      "*.safetensors), a config.json alone, or one .zip of the folder.")
    if len(uploads) > limits.max_files:
        raise UploadRejected("too_many_files", f"{len(uploads)} files uploaded; at most {limits.max_files} "
                                               "are accepted. Remove files the model does not need.")
    names = _unwrap_common_folder([_normalise_name(u.path or u.file.name) for u in uploads])
    check_filenames(names)
    total = 0
    for name, upload in zip(names, uploads):
        size = upload.file.size
        if size > limits.max_file_bytes:
            raise UploadRejected("too_large", f"{name} is {size:,} bytes; the limit per file is "
                                              f"{limits.max_file_bytes:,}. Shard the weights into smaller files.")
        total += size
        if total > limits.max_total_bytes:
            raise UploadRejected("too_large", f"the upload exceeds {limits.max_total_bytes:,} bytes in total.")
    is_zip = len(names) == 1 and names[0].lower().endswith(".zip")
    for name, upload in zip(names, uploads):
        target = staging / ("upload.zip" if is_zip else name)
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "xb") as out:
            for chunk in upload.file.chunks():
                out.write(chunk)
    if is_zip:
        archive = staging / "upload.zip"
        content = staging / "content"
        content.mkdir()
        extract_zip(archive, content, limits=limits)
        archive.unlink()
        for item in content.iterdir():
            item.rename(staging / item.name)
        content.rmdir()


def model_version_upload(*, actor: Actor, organization: Organization, model_name: str,
                         uploads: list[NamedUpload]) -> ModelVersion:
    """Validate and record a new version of `model_name`. Raises UploadRejected; leaves nothing behind."""
    if not actor.can_write(organization.pk):
        raise UploadRejected(RejectCode.FORBIDDEN, "Your role cannot upload models; ask an owner of the organization.")
    model_name = (model_name or "").strip()
    if not model_name or len(model_name) > 200:
        raise UploadRejected("bad_name", "Give the model a name of 1 to 200 characters.")
    upload_quota_charge(organization_id=organization.pk, uploads=uploads)
    limits = upload_limits()
    media = Path(settings.MEDIA_ROOT)
    staging = media / "staging" / uuid.uuid4().hex
    final: Path | None = None
    staging.mkdir(parents=True)
    try:
        _stage(uploads, staging, limits)
        info = validate_model_dir(staging, limits=limits)
        with transaction.atomic():
            model, _ = Model.objects.get_or_create(
                organization=organization, name=model_name,
                defaults={"created_by": actor.user if actor.user is not None else None},
            )
            Model.objects.select_for_update().filter(pk=model.pk).first()
            number = (model.versions.aggregate(n=Max("number"))["n"] or 0) + 1
            version = ModelVersion(
                model=model, number=number, kind=info.kind, family=info.family,
                architecture=info.architecture, parameter_count=info.parameter_count, dtype=info.dtype,
                config=info.config, total_bytes=sum(f.size for f in info.files),
                uploaded_by=actor.audit_label,
            )
            final = media / "models" / str(organization.pk) / str(version.id)
            version.storage_dir = str(final.relative_to(media))
            version.save()
            ModelFile.objects.bulk_create(
                ModelFile(version=version, path=f.path, size=f.size, sha256=f.sha256) for f in info.files
            )
            audit_record(action="model.uploaded", actor=actor, organization_id=organization.pk,
                         target=f"model_version:{version.id}",
                         data={"model": model_name, "number": number, "kind": info.kind,
                               "files": {f.path: f.sha256 for f in info.files}})
            final.parent.mkdir(parents=True, exist_ok=True)
            staging.rename(final)
        return version
    except BaseException as exc:
        if final is not None and final.exists():
            shutil.rmtree(final, ignore_errors=True)
        if isinstance(exc, IntegrityError):
            log.warning("upload of %r for org %s hit a constraint: %s", model_name, organization.pk, exc)
            raise UploadRejected("conflict", "Another upload of this model finished at the same moment: "
                                             "retry.") from None
        raise
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def version_path(version: ModelVersion) -> Path:
    return Path(settings.MEDIA_ROOT) / version.storage_dir
