"""An optimization artifact as the judge handles it: a JSON document under a published schema,
checked for its shape here, and applied to the model only inside the sandboxed worker, by the code
the artifact's author names. The judge never imports the optimizer.

`dyno.optimization-artifact/1` documents are applied by `optimizer.model:apply` unless they name
another applier (`"applier": "module:function"`); the applier runs in the optimized worker, like any
candidate code, and its failure is the artifact's.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

SCHEMA = "dyno.optimization-artifact/1"
REQUIRED = ("model", "device", "hardware", "versions", "workload", "strategy", "modules", "kernels")
DEFAULT_APPLIER = "optimizer.model:apply"
_APPLIER = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


def artifact_document(artifact: Any) -> dict[str, Any] | None:
    """The artifact as JSON (an object with `to_dict()`, a mapping, or None), its shape checked.
    Raises ValueError saying what is wrong."""
    if artifact is None:
        return None
    data = artifact.to_dict() if hasattr(artifact, "to_dict") else artifact
    if not isinstance(data, Mapping):
        raise ValueError(f"an optimization artifact is a JSON object, not {type(data).__name__}")
    if data.get("schema") != SCHEMA:
        raise ValueError(f"artifact schema {data.get('schema')!r} is not {SCHEMA!r}; re-run optimize-model")
    missing = [key for key in REQUIRED if key not in data]
    if missing:
        raise ValueError(f"the artifact lacks {', '.join(missing)}")
    if not isinstance(data.get("modules"), list) or not isinstance(data.get("kernels"), Mapping):
        raise ValueError("the artifact's modules must be a list and its kernels an object")
    applier = data.get("applier", DEFAULT_APPLIER)
    if not isinstance(applier, str) or not _APPLIER.match(applier):
        raise ValueError(f"the artifact's applier {applier!r} is not 'module:function'")
    return dict(data)


def applier_source(artifact: dict[str, Any]) -> str:
    """Python source, run in the optimized worker, defining `transform(model)` that applies `artifact`."""
    module, function = str(artifact.get("applier", DEFAULT_APPLIER)).split(":")
    return (f"import json\nfrom {module} import {function} as _apply\n"
            f"_ARTIFACT = json.loads({json.dumps(json.dumps(artifact, sort_keys=True))})\n"
            "def transform(model):\n    return _apply(model, _ARTIFACT) or model\n")
