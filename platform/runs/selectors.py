"""Reads of runs, through the acting user's or key's organizations."""

from __future__ import annotations

from django.db.models import QuerySet
from django.shortcuts import get_object_or_404

from accounts.selectors import Actor
from runs.models import Run


def run_list(*, actor: Actor) -> QuerySet[Run]:
    return (Run.objects.select_related("model_version", "model_version__model")
            .filter(organization_id__in=actor.org_ids).order_by("-created_at"))


def run_get(*, actor: Actor, run_id) -> Run:
    return get_object_or_404(Run.objects.select_related("model_version", "model_version__model"),
                             pk=run_id, organization_id__in=actor.org_ids)
