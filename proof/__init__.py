"""What an auditor needs to check a signed Dyno report offline: the canonical bytes a signature
covers (`proof.canonical`) and Ed25519 signatures over them (`proof.signature`).

Needs only `cryptography` and the standard library; imports nothing else from Dyno, so this
folder alone can be copied to a laptop. `python -m proof verify report.json signature.json --keys keys.json`.
"""
