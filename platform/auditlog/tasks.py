"""Beat's daily audit-log checkpoint (auditlog/checkpoint.py), written where the operator keeps
them: DYNO_AUDIT_CHECKPOINT_DIR should be a mount that outlives, and is not writable from, the
database host (object storage, another machine)."""

from __future__ import annotations

import json
from pathlib import Path

from celery import shared_task
from django.conf import settings

from auditlog.checkpoint import checkpoint_make


@shared_task(name="auditlog.checkpoint")
def auditlog_checkpoint_task() -> str:
    document = checkpoint_make()
    out = Path(settings.DYNO_AUDIT_CHECKPOINT_DIR)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"checkpoint-{document['checkpoint']['seq']}.json"
    staging = path.with_name(path.name + ".new")
    staging.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n")
    staging.replace(path)
    return str(path)
