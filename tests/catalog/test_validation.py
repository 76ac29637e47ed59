"""Upload validation: every refused kind of upload with its reason code, and the accepted kinds."""

from __future__ import annotations

import hashlib
import json
import shutil
import stat
import struct
import zipfile
from pathlib import Path

import pytest

from catalog.validation import (
    PICKLE_SUFFIXES,
    RejectCode,
    UploadLimits,
    UploadRejected,
    check_filenames,
    extract_zip,
    read_safetensors_header,
    validate_model_dir,
)
from runners.samples import write_sample_model

LIMITS = UploadLimits()


@pytest.fixture(scope="module")
def samples(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("samples")
    made = {family: write_sample_model(root / family, family) for family in ("llama", "mixtral", "gpt2", "bert", "mamba")}
    made["llama-card"] = write_sample_model(root / "llama-card", "llama", weights=False)
    return made


@pytest.fixture
def llama(samples: dict[str, Path], tmp_path: Path) -> Path:
    """A private copy of the llama sample that a test may damage."""
    return Path(shutil.copytree(samples["llama"], tmp_path / "upload"))


def rejected(root: Path, limits: UploadLimits = LIMITS) -> UploadRejected:
    with pytest.raises(UploadRejected) as caught:
        validate_model_dir(root, limits=limits)
    return caught.value


def write_safetensors(path: Path, header: dict, data: bytes, *, declared_len: int | None = None) -> None:
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw) if declared_len is None else declared_len) + raw + data)


def edit_config(root: Path, **changes: object) -> None:
    config = json.loads((root / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    (root / "config.json").write_text(json.dumps(config))


def zip_folder(folder: Path, archive: Path, *, prefix: str = "") -> Path:
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zf:
        for path in sorted(folder.iterdir()):
            zf.write(path, prefix + path.name)
    return archive


def extract_rejected(archive: Path, dest: Path, limits: UploadLimits = LIMITS) -> UploadRejected:
    with pytest.raises(UploadRejected) as caught:
        extract_zip(archive, dest, limits=limits)
    return caught.value


# -- pickles and names --------------------------------------------------------------------------


@pytest.mark.parametrize("suffix", sorted(PICKLE_SUFFIXES))
def test_it_refuses_every_pickle_format_by_name(suffix: str) -> None:
    with pytest.raises(UploadRejected) as caught:
        check_filenames(["config.json", f"pytorch_model{suffix}"])
    assert caught.value.code == "pickle_format"
    assert "executes" in caught.value.message and "safetensors" in caught.value.message


@pytest.mark.parametrize("suffix", [".bin", ".pt", ".pth", ".pkl", ".ckpt", ".PT"])
def test_it_refuses_a_pickle_in_the_staged_folder(llama: Path, suffix: str) -> None:
    (llama / f"weights{suffix}").write_bytes(b"\x80\x04not really")
    error = rejected(llama)
    assert error.code == "pickle_format"
    assert "save_pretrained" in error.message


@pytest.mark.parametrize("name", ["../escape.json", "/etc/passwd", "C:\\model\\config.json", "a/../../b", "bad\nname"])
def test_it_refuses_unsafe_names_before_writing(name: str) -> None:
    with pytest.raises(UploadRejected) as caught:
        check_filenames([name])
    assert caught.value.code == "unsafe_path"


def test_it_accepts_plain_names_and_a_zip() -> None:
    check_filenames(["config.json", "model.safetensors", "tokenizer.json"])
    check_filenames(["my-model.zip"])
    check_filenames(["folder/config.json"])  # browser folder uploads keep the folder name


def test_it_refuses_an_empty_list_of_names() -> None:
    with pytest.raises(UploadRejected) as caught:
        check_filenames([])
    assert caught.value.code == "empty"


# -- limits -------------------------------------------------------------------------------------


def test_it_refuses_an_oversized_file(llama: Path) -> None:
    size = (llama / "model.safetensors").stat().st_size
    error = rejected(llama, UploadLimits(max_file_bytes=size - 1))
    assert error.code == "too_large" and "model.safetensors" in error.message


def test_it_refuses_an_upload_over_the_total(llama: Path) -> None:
    total = sum(p.stat().st_size for p in llama.iterdir())
    error = rejected(llama, UploadLimits(max_total_bytes=total - 1))
    assert error.code == "too_large"


def test_it_refuses_too_many_files(llama: Path) -> None:
    error = rejected(llama, UploadLimits(max_files=2))
    assert error.code == "too_many_files"


def test_it_refuses_an_empty_folder(tmp_path: Path) -> None:
    assert rejected(tmp_path).code == "empty"


# -- files and layout ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["model.onnx", "run.sh", "weights.h5", "model.gguf"])
def test_it_refuses_unexpected_files_and_lists_what_is_allowed(llama: Path, name: str) -> None:
    (llama / name).write_bytes(b"x")
    error = rejected(llama)
    assert error.code == "unexpected_file"
    assert name in error.message and "Allowed:" in error.message and "tokenizer.json" in error.message


def test_it_refuses_files_in_sub_folders(llama: Path) -> None:
    (llama / "extra").mkdir()
    (llama / "extra" / "config.json").write_text("{}")
    assert rejected(llama).code == "unexpected_file"


def test_it_refuses_links_in_the_staged_folder(llama: Path) -> None:
    (llama / "tokenizer.json").symlink_to("/etc/hostname")
    assert rejected(llama).code == "unexpected_file"


def test_it_requires_a_config(llama: Path) -> None:
    (llama / "config.json").unlink()
    assert rejected(llama).code == "missing_config"


def test_it_refuses_a_single_weight_file_with_another_name(llama: Path) -> None:
    (llama / "model.safetensors").rename(llama / "weights.safetensors")
    error = rejected(llama)
    assert error.code == "weights_layout" and "model.safetensors" in error.message


def test_it_refuses_several_weight_files_without_an_index(llama: Path) -> None:
    shutil.copy(llama / "model.safetensors", llama / "model-00002-of-00002.safetensors")
    assert rejected(llama).code == "weights_layout"


# -- safetensors headers ------------------------------------------------------------------------


def test_it_refuses_a_truncated_safetensors(llama: Path) -> None:
    weights = llama / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    error = rejected(llama)
    assert error.code == "bad_safetensors" and "truncated" in error.message


def test_it_refuses_a_file_shorter_than_the_length_prefix(llama: Path) -> None:
    (llama / "model.safetensors").write_bytes(b"\x01\x02")
    assert rejected(llama).code == "bad_safetensors"


def test_it_refuses_a_header_length_past_the_end_of_the_file(llama: Path) -> None:
    weights = llama / "model.safetensors"
    body = weights.read_bytes()
    weights.write_bytes(struct.pack("<Q", len(body)) + body[8:])
    error = rejected(llama)
    assert error.code == "bad_safetensors" and "header length" in error.message


def test_it_refuses_an_absurd_header_length(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    write_safetensors(path, {}, b"", declared_len=2**40)
    with pytest.raises(UploadRejected) as caught:
        read_safetensors_header(path)
    assert caught.value.code == "bad_safetensors"


def test_it_refuses_offsets_past_the_data(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    write_safetensors(path, {"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, b"\0" * 8)
    with pytest.raises(UploadRejected) as caught:
        read_safetensors_header(path)
    assert caught.value.code == "bad_safetensors" and "truncated" in caught.value.message


def test_it_refuses_offsets_that_disagree_with_the_shape(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    write_safetensors(path, {"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 12]}}, b"\0" * 12)
    with pytest.raises(UploadRejected) as caught:
        read_safetensors_header(path)
    assert "offsets span" in caught.value.message


def test_it_refuses_overlapping_tensors_and_gaps(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    overlap = {
        "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
        "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]},
    }
    write_safetensors(path, overlap, b"\0" * 12)
    with pytest.raises(UploadRejected, match="overlaps"):
        read_safetensors_header(path)
    gap = {"a": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}
    write_safetensors(path, gap, b"\0" * 12)
    with pytest.raises(UploadRejected, match="gap"):
        read_safetensors_header(path)


def test_it_refuses_trailing_bytes_and_unknown_dtypes(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    write_safetensors(path, {"w": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 8)
    with pytest.raises(UploadRejected, match="belong to no tensor"):
        read_safetensors_header(path)
    write_safetensors(path, {"w": {"dtype": "OBJ", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4)
    with pytest.raises(UploadRejected, match="unknown dtype"):
        read_safetensors_header(path)


def test_it_reads_a_valid_header_without_loading_tensors(samples: dict[str, Path]) -> None:
    from safetensors import safe_open

    tensors = read_safetensors_header(samples["llama"] / "model.safetensors")
    with safe_open(str(samples["llama"] / "model.safetensors"), "pt") as reference:
        assert set(tensors) == set(reference.keys())
        name = "model.layers.0.mlp.gate_proj.weight"
        assert list(tensors[name].shape) == list(reference.get_slice(name).get_shape())
    assert tensors[name].shape == (128, 64) and tensors[name].dtype == "F32"


# -- config -------------------------------------------------------------------------------------


def test_it_refuses_a_config_that_is_not_json(llama: Path) -> None:
    (llama / "config.json").write_text("{'model_type': 'llama'")
    assert rejected(llama).code == "invalid_json"


def test_it_refuses_other_broken_json_files(llama: Path) -> None:
    (llama / "tokenizer_config.json").write_text("{")
    error = rejected(llama)
    assert error.code == "invalid_json" and "tokenizer_config.json" in error.message


def test_it_refuses_a_config_without_model_type(llama: Path) -> None:
    edit_config(llama, model_type=None)
    assert rejected(llama).code == "missing_model_type"


def test_it_refuses_an_unknown_model_type(llama: Path) -> None:
    edit_config(llama, model_type="totally-new-arch")
    error = rejected(llama)
    assert error.code == "unknown_architecture" and "totally-new-arch" in error.message


def test_it_refuses_an_architecture_transformers_does_not_ship(llama: Path) -> None:
    edit_config(llama, architectures=["MyLlamaForCausalLM"])
    assert rejected(llama).code == "unknown_architecture"


def test_it_refuses_an_architecture_of_another_family(llama: Path) -> None:
    edit_config(llama, architectures=["GPT2LMHeadModel"])
    assert rejected(llama).code == "unknown_architecture"


def test_it_refuses_custom_code_in_the_config(llama: Path) -> None:
    edit_config(llama, auto_map={"AutoModelForCausalLM": "modeling_evil.EvilModel"})
    error = rejected(llama)
    assert error.code == "custom_code" and "trust_remote_code" in error.message


def test_it_refuses_custom_tokenizer_code(llama: Path) -> None:
    (llama / "tokenizer_config.json").write_text(json.dumps({"auto_map": {"AutoTokenizer": ["tok.Evil", None]}}))
    assert rejected(llama).code == "custom_code"


def test_it_refuses_a_config_transformers_rejects(llama: Path) -> None:
    edit_config(llama, num_attention_heads=5)  # 64 is not divisible by 5
    assert rejected(llama).code == "invalid_config"


def test_it_refuses_an_absurd_layer_count(llama: Path) -> None:
    edit_config(llama, num_hidden_layers=10**7)
    assert rejected(llama).code == "invalid_config"


def test_it_refuses_a_card_larger_than_runners_build(samples: dict[str, Path], tmp_path: Path) -> None:
    card = Path(shutil.copytree(samples["llama-card"], tmp_path / "card"))
    # A 70B-class llama: nothing is allocated to count it (meta device), and it is refused as a card.
    edit_config(card, hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
                num_key_value_heads=8, vocab_size=128256)
    error = rejected(card)
    assert error.code == "model_too_large" and "parameters" in error.message and "safetensors" in error.message
    assert validate_model_dir(card, limits=UploadLimits(max_card_parameters=10**12)).parameter_count > 50 * 10**9


def test_it_refuses_a_config_whose_module_tree_outlasts_its_time_budget(llama: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever key makes an architecture build slowly, the build runs in a child that is stopped."""
    import time as _time

    from runners import modelload

    monkeypatch.setattr(modelload, "count_parameters", lambda model: _time.sleep(30) or 0)
    started = _time.monotonic()
    error = rejected(llama, UploadLimits(build_seconds=1))
    assert error.code == "model_too_large" and "1 s" in error.message
    assert _time.monotonic() - started < 10


# -- accepted uploads ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("family", "architecture"),
    [
        ("llama", "LlamaForCausalLM"),
        ("mixtral", "MixtralForCausalLM"),
        ("gpt2", "GPT2LMHeadModel"),
        ("bert", "BertForMaskedLM"),
        ("mamba", "MambaForCausalLM"),
    ],
)
def test_it_accepts_weights_folders_of_several_families(samples: dict[str, Path], family: str, architecture: str) -> None:
    info = validate_model_dir(samples[family], limits=LIMITS)
    assert (info.kind, info.family, info.architecture, info.dtype) == ("weights", family, architecture, "float32")
    tensors = read_safetensors_header(samples[family] / "model.safetensors")
    assert info.parameter_count == sum(entry.numel for entry in tensors.values()) > 10_000
    assert "model.safetensors" in [f.path for f in info.files]


def test_it_hashes_every_kept_file(samples: dict[str, Path]) -> None:
    info = validate_model_dir(samples["llama"], limits=LIMITS)
    on_disk = sorted(p.name for p in samples["llama"].iterdir())
    assert [f.path for f in info.files] == on_disk
    for kept in info.files:
        content = (samples["llama"] / kept.path).read_bytes()
        assert kept.sha256 == hashlib.sha256(content).hexdigest()
        assert kept.size == len(content)


def test_it_accepts_an_architecture_card_and_estimates_its_size(samples: dict[str, Path]) -> None:
    card = validate_model_dir(samples["llama-card"], limits=LIMITS)
    weights = validate_model_dir(samples["llama"], limits=LIMITS)
    assert card.kind == "card" and [f.path for f in card.files] == ["config.json"]
    assert card.parameter_count == weights.parameter_count
    assert card.dtype == "float32" and card.architecture == "LlamaForCausalLM"


def test_it_takes_a_card_dtype_from_the_config(samples: dict[str, Path], tmp_path: Path) -> None:
    card = Path(shutil.copytree(samples["llama-card"], tmp_path / "card"))
    edit_config(card, dtype=None, torch_dtype="bfloat16")  # transformers 4.x spelling
    assert validate_model_dir(card, limits=LIMITS).dtype == "bfloat16"


def test_it_accepts_tokenizer_and_readme_files(llama: Path) -> None:
    (llama / "tokenizer.json").write_text(json.dumps({"version": "1.0", "model": {}}))
    (llama / "special_tokens_map.json").write_text("{}")
    (llama / "README.md").write_text("# tiny llama\n")
    names = [f.path for f in validate_model_dir(llama, limits=LIMITS).files]
    assert {"tokenizer.json", "special_tokens_map.json", "README.md"} <= set(names)


def test_it_accepts_sharded_weights_with_their_index(tmp_path: Path) -> None:
    import transformers

    from runners.modelload import load_model
    from runners.samples import sample_config

    model = transformers.LlamaForCausalLM(sample_config("llama"))
    model.save_pretrained(tmp_path / "sharded", max_shard_size="100KB")
    shards = sorted((tmp_path / "sharded").glob("*.safetensors"))
    assert len(shards) > 1 and (tmp_path / "sharded" / "model.safetensors.index.json").exists()
    info = validate_model_dir(tmp_path / "sharded", limits=LIMITS)
    assert info.kind == "weights" and info.parameter_count == sum(p.numel() for p in model.parameters())
    loaded, _ = load_model(tmp_path / "sharded")
    assert loaded.model.embed_tokens.weight.equal(model.model.embed_tokens.weight)


def test_it_refuses_an_index_that_names_a_missing_shard(tmp_path: Path) -> None:
    import transformers

    from runners.samples import sample_config

    transformers.LlamaForCausalLM(sample_config("llama")).save_pretrained(tmp_path / "m", max_shard_size="100KB")
    sorted((tmp_path / "m").glob("*.safetensors"))[-1].unlink()
    error = rejected(tmp_path / "m")
    assert error.code == "weights_layout" and "not in the upload" in error.message


# -- zips ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("prefix", ["", "tiny-llama/", "outer/inner/"])
def test_it_extracts_a_zip_with_or_without_a_top_level_folder(samples: dict[str, Path], tmp_path: Path, prefix: str) -> None:
    archive = zip_folder(samples["llama"], tmp_path / "m.zip", prefix=prefix)
    extract_zip(archive, tmp_path / "out", limits=LIMITS)
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(p.name for p in samples["llama"].iterdir())
    info = validate_model_dir(tmp_path / "out", limits=LIMITS)
    original = validate_model_dir(samples["llama"], limits=LIMITS)
    assert [f.sha256 for f in info.files] == [f.sha256 for f in original.files]


def test_it_skips_macos_droppings_in_zips(samples: dict[str, Path], tmp_path: Path) -> None:
    archive = zip_folder(samples["llama-card"], tmp_path / "m.zip", prefix="m/")
    with zipfile.ZipFile(archive, "a") as zf:
        zf.writestr("__MACOSX/m/._config.json", b"\0\5\26\7")
        zf.writestr("m/.DS_Store", b"junk")
    extract_zip(archive, tmp_path / "out", limits=LIMITS)
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["config.json"]


@pytest.mark.parametrize("name", ["../x.json", "m/../../x.json", "/abs/config.json", "C:\\config.json"])
def test_it_refuses_zip_entries_that_leave_the_folder(tmp_path: Path, name: str) -> None:
    with zipfile.ZipFile(tmp_path / "evil.zip", "w") as zf:
        zf.writestr(zipfile.ZipInfo(name), b"{}")
    error = extract_rejected(tmp_path / "evil.zip", tmp_path / "out")
    assert error.code == "zip_traversal"
    assert not (tmp_path / "x.json").exists() and list((tmp_path / "out").iterdir()) == []


def test_it_refuses_symlink_entries(tmp_path: Path) -> None:
    link = zipfile.ZipInfo("tokenizer.json")
    link.external_attr = (stat.S_IFLNK | 0o777) << 16
    with zipfile.ZipFile(tmp_path / "evil.zip", "w") as zf:
        zf.writestr("config.json", b"{}")
        zf.writestr(link, b"/etc/passwd")
    assert extract_rejected(tmp_path / "evil.zip", tmp_path / "out").code == "zip_link"
    assert list((tmp_path / "out").iterdir()) == []


def test_it_refuses_a_pickle_inside_a_zip(tmp_path: Path) -> None:
    with zipfile.ZipFile(tmp_path / "m.zip", "w") as zf:
        zf.writestr("m/pytorch_model.bin", b"\x80\x04")
    assert extract_rejected(tmp_path / "m.zip", tmp_path / "out").code == "pickle_format"


def test_it_refuses_a_high_ratio_compression_bomb(tmp_path: Path) -> None:
    with zipfile.ZipFile(tmp_path / "bomb.zip", "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("model.safetensors", b"\0" * (8 * 2**20))  # 8 MiB of zeros: ~1000x
    error = extract_rejected(tmp_path / "bomb.zip", tmp_path / "out")
    assert error.code == "zip_bomb" and "compression bomb" in error.message
    assert list((tmp_path / "out").iterdir()) == []


def _patch_sizes(archive: Path, declared: int) -> None:
    """Make the local header and the central directory both lie about the uncompressed size."""
    data = bytearray(archive.read_bytes())
    local = data.index(b"PK\x03\x04")
    central = data.index(b"PK\x01\x02")
    struct.pack_into("<I", data, local + 22, declared)
    struct.pack_into("<I", data, central + 24, declared)
    archive.write_bytes(bytes(data))


def test_it_catches_an_entry_that_lies_about_its_size(tmp_path: Path) -> None:
    with zipfile.ZipFile(tmp_path / "liar.zip", "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("README.md", b"a" * (4 * 2**20))
    _patch_sizes(tmp_path / "liar.zip", 1000)  # small enough to pass every declared-size check
    with zipfile.ZipFile(tmp_path / "liar.zip") as zf:
        assert zf.infolist()[0].file_size == 1000
    error = extract_rejected(tmp_path / "liar.zip", tmp_path / "out")
    assert error.code == "zip_bomb" and "declares" in error.message
    written = tmp_path / "out" / "README.md"
    assert not written.exists() or written.stat().st_size <= 2**20


def test_it_refuses_an_entry_declared_over_the_limits(tmp_path: Path) -> None:
    with zipfile.ZipFile(tmp_path / "big.zip", "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("model.safetensors", b"x" * 5000)
    error = extract_rejected(tmp_path / "big.zip", tmp_path / "out", UploadLimits(max_file_bytes=4000))
    assert error.code == "too_large"
    error = extract_rejected(tmp_path / "big.zip", tmp_path / "out2", UploadLimits(max_total_bytes=4000))
    assert error.code == "too_large"


def test_it_refuses_too_many_zip_entries(tmp_path: Path) -> None:
    with zipfile.ZipFile(tmp_path / "many.zip", "w") as zf:
        for i in range(12):
            zf.writestr(f"f{i}.txt", b"x")
    error = extract_rejected(tmp_path / "many.zip", tmp_path / "out", UploadLimits(max_zip_entries=10))
    assert error.code == "too_many_files"


def test_it_refuses_a_file_that_is_not_a_zip(tmp_path: Path) -> None:
    (tmp_path / "m.zip").write_bytes(b"this is not a zip")
    assert extract_rejected(tmp_path / "m.zip", tmp_path / "out").code == "bad_zip"


def test_it_refuses_duplicate_zip_entries(tmp_path: Path) -> None:
    with zipfile.ZipFile(tmp_path / "dup.zip", "w") as zf:
        zf.writestr("config.json", b"{}")
        with pytest.warns(UserWarning):
            zf.writestr("config.json", b"{}")
    assert extract_rejected(tmp_path / "dup.zip", tmp_path / "out").code == "bad_zip"


def test_rejection_codes_are_the_documented_strings() -> None:
    error = UploadRejected(RejectCode.ZIP_BOMB, "x")
    assert error.code == "zip_bomb" and type(error.code) is str
