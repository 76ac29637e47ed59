"""URLs of the metering app (finance and customer pages, billing API)."""

urlpatterns: list = []
