"""Key the existing chain: when the log holds events written before keying (scheme 1), append one
keyed event, `auditlog.keyed`, whose HMAC covers the last of them.

From then on the unkeyed history is pinned by a digest only the key holder can make, and a chain
that ends unkeyed is a rewritten one (verify_auditlog). An empty log needs no marker: its first
event is keyed. Needs the audit key (auditlog/keys.py): development creates it, production must
provide it before migrating.
"""

from django.db import migrations
from django.utils import timezone

from auditlog.chain import KEYED, UNKEYED, event_digest
from auditlog.keys import audit_key, audit_key_id

ACTION = "auditlog.keyed"


def append_marker(apps, schema_editor) -> None:
    event_model = apps.get_model("auditlog", "AuditEvent")
    head_model = apps.get_model("auditlog", "AuditChainHead")
    last = event_model.objects.order_by("-seq").first()
    if last is None or last.scheme != UNKEYED:
        return
    key = audit_key(create=True)
    head, _ = head_model.objects.select_for_update().get_or_create(pk=1)
    seq, at = last.seq + 1, timezone.now()
    data = {"scheme": KEYED, "unkeyed_events": last.seq, "key_id": audit_key_id(key)}
    fields = dict(seq=seq, at=at.isoformat(), action=ACTION, actor="system:migration", organization_id=None,
                  target="auditlog", data=data, prev_hash=last.hash)
    digest = event_digest(scheme=KEYED, key=key, **fields)
    event_model.objects.create(seq=seq, at=at, action=ACTION, actor="system:migration", organization_id=None,
                               target="auditlog", data=data, prev_hash=last.hash, hash=digest, scheme=KEYED)
    head_model.objects.filter(pk=head.pk).update(seq=seq, last_hash=digest)


class Migration(migrations.Migration):
    dependencies = [("auditlog", "0003_auditevent_scheme")]
    operations = [migrations.RunPython(append_marker, migrations.RunPython.noop)]
