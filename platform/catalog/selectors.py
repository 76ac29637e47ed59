"""Reads of the model catalog, always through the acting user's or key's organizations."""

from __future__ import annotations

from django.db.models import Count, QuerySet
from django.shortcuts import get_object_or_404

from accounts.selectors import Actor
from catalog.models import Model, ModelVersion


def model_list(*, actor: Actor) -> QuerySet[Model]:
    return (Model.objects.filter(organization_id__in=actor.org_ids)
            .annotate(version_count=Count("versions")).order_by("name"))


def model_get(*, actor: Actor, model_id) -> Model:
    return get_object_or_404(Model, pk=model_id, organization_id__in=actor.org_ids)


def model_version_get(*, actor: Actor, version_id) -> ModelVersion:
    return get_object_or_404(
        ModelVersion.objects.select_related("model", "model__organization"),
        pk=version_id, model__organization_id__in=actor.org_ids,
    )


def model_versions_for_org(*, actor: Actor) -> QuerySet[ModelVersion]:
    return (ModelVersion.objects.select_related("model")
            .filter(model__organization_id__in=actor.org_ids).order_by("model__name", "-number"))
