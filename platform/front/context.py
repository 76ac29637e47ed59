"""Template context shared by every page: who is signed in and for which organization."""

from accounts.selectors import actor_for_user


def navigation(request) -> dict:
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}
    actor = actor_for_user(user)
    request.actor = actor
    orgs = list(user.memberships.select_related("organization").values_list("organization__name", flat=True))
    return {"nav_orgs": orgs, "nav_is_staff": user.is_staff}
