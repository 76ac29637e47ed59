from django.apps import AppConfig


class AccountsConfig(AppConfig):
    name = "accounts"

    def ready(self) -> None:
        from django.contrib.auth.signals import user_logged_in

        from accounts.backends import signed_in

        # Every successful sign-in (the sign-in page, the admin's) clears the client's failures.
        user_logged_in.connect(signed_in, dispatch_uid="accounts.signed_in")
