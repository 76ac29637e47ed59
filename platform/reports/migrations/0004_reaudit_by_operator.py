from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("reports", "0003_immutable")]

    operations = [
        migrations.AddField(model_name="reauditrequest", name="by_operator", field=models.BooleanField(default=False)),
    ]
