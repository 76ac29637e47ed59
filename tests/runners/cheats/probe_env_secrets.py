"""Looks for secrets in its environment and reports every variable it can see."""
# probe: environment
import json
import os

raise RuntimeError("PROBE-REPORT " + json.dumps(sorted(os.environ)))
