"""`manage.py seed_demo`: the demo organization, its user, an operator and a contract, for `make demo`."""

import os

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from django.utils import timezone

from accounts.models import Organization, Role
from accounts.services import member_add, organization_create
from metering.contracts import contract_terms_from, contract_version_create
from metering.models import Contract
from metering.periods import Period
from runners.names import SUITE_VERSION

# The demo's money terms: a 20% share of the saving, priced for the demo's CPU runner and two GPU
# classes, measured on the suite the runners run. Only a stable report bills under it.
DEMO_TERMS = {
    "revenue_share": "0.20", "minimum_speedup": "1.05", "currency": "EUR", "dispute_window_days": 30,
    "prices": {"cpu": "0.10", "gpu-h100": "2.50", "gpu-h200": "4.00"},
    "measurement_plan": {"suite_version": SUITE_VERSION, "baseline": "eager PyTorch with the standard ops"},
}


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
        if not Contract.objects.filter(organization=org).exists():
            contract_version_create(organization=org, terms=contract_terms_from(DEMO_TERMS),
                                    effective_from=Period.of(timezone.now().date()).first_day, actor="system:seed_demo")
        self.stdout.write(f"demo sign-in: {email} / {password}   (operator: operator@dyno.local / {password})")
