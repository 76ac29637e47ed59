"""The tuning cache: keys (buckets, versions, source hash), the JSON-lines store's newest-wins
reads, torn lines, and concurrent appends from several processes."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

from optimizer.cache import JsonlTuningCache, TuningEntry, bucket, kernels_sha256, make_key, shape_bucket


def entry(candidate: str = "compile-fused", seconds: float = 12.5) -> TuningEntry:
    return TuningEntry(params={"variant": candidate, "mode": "default"}, candidate=candidate, source_sha256="ab" * 32,
                       shape={"R": 500, "H": 256}, speedup_estimate=1.7, tuning_seconds=seconds)


def key(**overrides: object):
    args = {"hardware": "hw", "device": "cpu", **overrides}
    return make_key("rmsnorm", {"R": 500, "H": 256}, "float32", **args)  # type: ignore[arg-type]


def test_it_buckets_the_batch_dimension_to_a_power_of_two_and_keeps_the_rest_exact():
    assert [bucket(n) for n in (1, 2, 3, 500, 512, 513)] == [1, 2, 4, 512, 512, 1024]
    assert shape_bucket("rmsnorm", {"R": 300, "H": 250}) == {"H": 250, "R": 512}
    assert shape_bucket("attention_decode", {"B": 3, "Hq": 32, "Hkv": 8, "L": 1000, "D": 64})["L"] == 1024
    assert key().digest() == make_key("rmsnorm", {"R": 400, "H": 256}, "float32", hardware="hw", device="cpu").digest()


def test_it_changes_the_key_with_versions_source_hardware_and_dtype():
    base = key().digest()
    assert key(torch_version="0.0.1").digest() != base
    assert key(triton_version="0.0.1").digest() != base
    assert key(source_sha256="0" * 64).digest() != base
    assert key(hardware="other").digest() != base
    assert make_key("rmsnorm", {"R": 500, "H": 256}, "bfloat16", hardware="hw", device="cpu").digest() != base


def test_it_hashes_a_familys_kernel_sources_including_what_they_import(tmp_path, monkeypatch):
    import optimizer.cache as cache_module

    kernels = tmp_path / "kernels"
    kernels.mkdir()
    for name in ("_common", "rmsnorm", "layernorm", "softmax"):
        (kernels / f"{name}.py").write_text(f"# {name}\n")
    (kernels / "layernorm.py").write_text("from optimizer.kernels.rmsnorm import default_block\n")
    monkeypatch.setattr(cache_module, "_KERNELS_DIR", kernels)
    before = {f: kernels_sha256(f) for f in ("rmsnorm", "layernorm", "softmax")}
    (kernels / "rmsnorm.py").write_text("# rmsnorm, changed\n")
    after = {f: kernels_sha256(f) for f in ("rmsnorm", "layernorm", "softmax")}
    assert after["rmsnorm"] != before["rmsnorm"]
    assert after["layernorm"] != before["layernorm"], "layernorm imports rmsnorm"
    assert after["softmax"] == before["softmax"]


def test_it_round_trips_entries_and_the_newest_line_wins(tmp_path: Path):
    cache = JsonlTuningCache(tmp_path / "sub" / "cache.jsonl")
    assert cache.get(key()) is None
    cache.put(key(), entry("compile-fused", 10.0))
    cache.put(key(hardware="other"), entry("baseline", 1.0))
    cache.put(key(), entry("eager-halves", 20.0))
    got = cache.get(key())
    assert got is not None and got.candidate == "eager-halves" and got.tuning_seconds == 20.0
    assert cache.get(key(hardware="other")).candidate == "baseline"  # type: ignore[union-attr]
    record = json.loads((tmp_path / "sub" / "cache.jsonl").read_text().splitlines()[0])
    assert record["key"]["shape_bucket"] == {"H": 256, "R": 512} and record["entry"]["tuning_seconds"] == 10.0


def test_it_skips_a_torn_line_and_keeps_appending_whole_lines(tmp_path: Path):
    path = tmp_path / "cache.jsonl"
    cache = JsonlTuningCache(path)
    cache.put(key(), entry("compile-fused"))
    with open(path, "ab") as f:
        f.write(b'{"schema": "dyno.tuning-cache/1", "key_digest": "')  # a writer killed mid-line
    assert cache.get(key()).candidate == "compile-fused"  # type: ignore[union-attr]
    cache.put(key(), entry("baseline"))
    assert cache.get(key()).candidate == "baseline"  # type: ignore[union-attr]
    lines = path.read_text().splitlines()
    assert len(lines) == 3 and json.loads(lines[-1])["entry"]["candidate"] == "baseline"


def _writer(path: str, worker: int, count: int) -> None:
    cache = JsonlTuningCache(path)
    for i in range(count):
        # Big enough records (~8 KiB) that unlocked writers would interleave.
        e = TuningEntry(params={"variant": "baseline", "pad": "x" * 8000}, candidate=f"w{worker}-{i}",
                        source_sha256="c" * 64, shape={"R": i, "H": 1}, speedup_estimate=None, tuning_seconds=0.1)
        cache.put(make_key("rmsnorm", {"R": 64, "H": 1000 * worker + i}, "float32", hardware="hw", device="cpu",
                           source_sha256="d" * 64), e)


def test_it_survives_concurrent_appends_from_several_processes(tmp_path: Path):
    path = tmp_path / "cache.jsonl"
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(str(path), w, 25)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    lines = path.read_bytes().split(b"\n")
    records = [json.loads(line) for line in lines if line]
    assert len(records) == 100
    assert {r["entry"]["candidate"] for r in records} == {f"w{w}-{i}" for w in range(4) for i in range(25)}
    cache = JsonlTuningCache(path)
    hit = cache.get(make_key("rmsnorm", {"R": 64, "H": 2006}, "float32", hardware="hw", device="cpu", source_sha256="d" * 64))
    assert hit is not None and hit.candidate == "w2-6"
