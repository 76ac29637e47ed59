"""What an optimization artifact did to the model, for people: the strategy deployed and, per
family of module, what was rewritten, what was kept and why (the artifact's own module entries,
grouped)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

STRATEGIES = {
    "patched-modules": "Dyno's kernels patched into the modules listed as optimized below",
    "whole-model-compile": "the whole model compiled with torch.compile",
    "baseline": "the model as transformers runs it (nothing beat it)",
}
STATUS = {"optimized": "rewritten", "baseline-kept": "kept (the baseline was the fastest choice)",
          "fallback": "kept (not supported)"}


def artifact_summary(artifact: dict[str, Any] | None) -> dict[str, Any] | None:
    if not isinstance(artifact, dict):
        return None
    strategy = str(artifact.get("strategy") or "")
    compiled = (artifact.get("verification") or {}).get("whole-model-compile") or {}
    groups: dict[tuple[str, str, str, str], dict[str, Any]] = {}
    counts: dict[tuple[str, str, str, str], int] = defaultdict(int)
    for entry in artifact.get("modules") or []:
        if not isinstance(entry, dict):
            continue
        key = (str(entry.get("family") or "other"), str(entry.get("status") or ""), str(entry.get("kernel") or ""),
               str(entry.get("reason") or ""))
        counts[key] += 1
        group = groups.setdefault(key, {"family": key[0], "status": STATUS.get(key[1], key[1]), "kernel": key[2],
                                        "reason": key[3], "classes": set()})
        group["classes"].add(str(entry.get("module_class") or "?"))
    rows = [{**group, "count": counts[key], "classes": ", ".join(sorted(group["classes"]))}
            for key, group in sorted(groups.items(), key=lambda item: (item[0][0], item[0][1]))]
    return {
        "strategy": strategy, "strategy_text": STRATEGIES.get(strategy, strategy),
        "variant": compiled.get("variant") if strategy == "whole-model-compile" else None,
        "rows": rows, "deployed": strategy == "patched-modules", "notes": list(artifact.get("notes") or [])[:10],
    }
