"""Template context shared by every page: who is signed in and for which organization."""


def navigation(request) -> dict:
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}
    orgs = list(user.memberships.select_related("organization").values_list("organization__name", flat=True))
    return {"nav_orgs": orgs, "nav_is_staff": user.is_staff}
