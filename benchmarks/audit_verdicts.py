"""Verdicts of a fixed set of audits at a given source tree, to compare two trees (a refactor of
the audit engine must not move a verdict).

Kernel audits of honest and cheating candidates on `cpu-ci` (seed 1234) and a whole-model audit of
the tiny Llama, eager against eager (seed 7, 3 rounds). What each round draws from the OS (order,
reveals, checked calls) still differs from run to run, so a cheat's set of reason codes may too.

    git worktree add /tmp/before <commit>
    .venv/bin/python benchmarks/audit_verdicts.py /tmp/before /tmp/before.json
    .venv/bin/python benchmarks/audit_verdicts.py . /tmp/after.json
"""
import json
import re
import sys
import tempfile
from pathlib import Path

root = Path(sys.argv[1]).resolve()
sys.path.insert(0, str(root))
from runners.evaluate import audit_candidate
from runners.modelaudit import audit_model_forward
from runners.samples import write_sample_model
cheats = root / "tests" / "runners" / "cheats"
honest = root / "tests" / "runners" / "honest"
cases = [("honest", honest / "rmsnorm_alternative.py"), ("honest", honest / "softmax_alternative.py"),
         ("honest", honest / "gemm_einsum.py")]
for name in ("background_burn.py", "alternating.py", "cache_data_ptr.py", "adv_known_picks.py", "adv_pool_memo.py",
             "adv2_lookahead_batch.py", "adv3_done_then_compute.py", "adv_split_allowance.py", "first_calls_only.py",
             "patch_timer_scale.py", "adv4_sliver_tail.py", "inplace_output.py"):
    cases.append(("cheat", cheats / name))
out = {}
for kind, path in cases:
    text = path.read_text()
    m = re.search(r"# workload: (\w+)", text)
    workload = m.group(1) if m else path.stem.split("_")[0]
    doc = audit_candidate(workload, text, profile="cpu-ci", device="cpu", seed=1234, label=path.stem)
    w = doc["workloads"][0]
    out[path.name] = [w["verdict"], sorted({r["code"] for r in w["reasons"]})]
    print(path.name, out[path.name], flush=True)
model = write_sample_model(Path(tempfile.mkdtemp()) / "llama", "llama")
for label in ("eager-vs-eager",):
    rep = audit_model_forward(model, None, batch=1, seq=16, device="cpu", profile="cpu-ci", seed=7, rounds=3)
    out["model:" + label] = [[p["phase"], p["verdict"], sorted({r["code"] for r in p["reasons"]})] for p in rep["phases"]]
    print(label, out["model:" + label], flush=True)
Path(sys.argv[2]).write_text(json.dumps(out, indent=1))
