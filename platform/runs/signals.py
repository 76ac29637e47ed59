"""What the runs app announces to the apps built on it (reports), so it never imports them."""

from django.dispatch import Signal

# A run ended without a result (failed or cancelled): kwargs run_id and error (why, for people).
run_ended_without_result = Signal()
