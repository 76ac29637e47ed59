"""Events say which digest links them (auditlog.chain): every existing row is scheme 1, SHA-256.

PostgreSQL adds the column with its default without rewriting a row, so the append-only trigger
(0002) does not fire.
"""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("auditlog", "0002_append_only")]
    operations = [
        migrations.AddField(model_name="auditevent", name="scheme",
                            field=models.PositiveSmallIntegerField(default=1)),
    ]
