"""URLs of the reports app (web pages and API endpoints)."""

urlpatterns: list = []
