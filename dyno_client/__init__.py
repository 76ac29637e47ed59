"""Dyno's customer command line (`python -m dyno_client`): upload, run, reports, usage."""
