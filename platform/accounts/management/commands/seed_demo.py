"""`manage.py seed_demo`: the demo organization, its user and an operator, for `make demo`."""

import os

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand

from accounts.models import Organization, Role
from accounts.services import member_add, organization_create


class Command(BaseCommand):
    help = "Create (or refresh) the demo organization and users; prints how to sign in."

    def handle(self, *args, **options) -> None:
        email = os.environ.get("DYNO_DEMO_EMAIL", "demo@dyno.local")
        password = os.environ.get("DYNO_DEMO_PASSWORD", "dyno-demo-password")
        org = Organization.objects.filter(slug="demo").first() or organization_create(slug="demo", name="Demo Org")
        user = member_add(organization=org, email=email, role=Role.OWNER)
        user.set_password(password)
        user.save()
        operator = get_user_model().objects.filter(username="operator@dyno.local").first()
        if operator is None:
            operator = get_user_model().objects.create_user(
                username="operator@dyno.local", email="operator@dyno.local", password=password)
        operator.is_staff = operator.is_superuser = True
        operator.set_password(password)
        operator.save()
        self.stdout.write(f"demo sign-in: {email} / {password}   (operator: operator@dyno.local / {password})")
