"""Metering: proven speedup -> billable speedup -> savings -> fees, and (later) the Django app.
The package root imports nothing: metering/fees.py must stay importable without Django."""
