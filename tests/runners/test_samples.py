"""Sample model folders: real transformers folders, tiny, deterministic per seed."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import transformers

from runners.samples import SAMPLE_FAMILIES, main, write_sample_model


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("family", sorted(SAMPLE_FAMILIES))
def test_it_writes_a_tiny_loadable_folder_for_each_family(tmp_path: Path, family: str) -> None:
    folder = write_sample_model(tmp_path / family, family)
    assert (folder / "config.json").exists() and (folder / "model.safetensors").exists()
    assert (folder / "model.safetensors").stat().st_size < 2 * 2**20
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == family
    assert config["architectures"] == [SAMPLE_FAMILIES[family][0]]
    model_class = getattr(transformers, SAMPLE_FAMILIES[family][0])
    model = model_class.from_pretrained(folder, local_files_only=True, use_safetensors=True)
    assert sum(p.numel() for p in model.parameters()) < 400_000


def test_it_writes_an_architecture_card_without_weights(tmp_path: Path) -> None:
    folder = write_sample_model(tmp_path / "card", "mixtral", weights=False)
    assert [p.name for p in folder.iterdir()] == ["config.json"]
    config = json.loads((folder / "config.json").read_text())
    assert config["num_local_experts"] == 4 and config["architectures"] == ["MixtralForCausalLM"]


def test_it_is_deterministic_per_seed(tmp_path: Path) -> None:
    a = write_sample_model(tmp_path / "a", "llama", seed=3) / "model.safetensors"
    b = write_sample_model(tmp_path / "b", "llama", seed=3) / "model.safetensors"
    c = write_sample_model(tmp_path / "c", "llama", seed=4) / "model.safetensors"
    assert digest(a) == digest(b) != digest(c)


def test_it_refuses_an_unknown_family(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="llama"):
        write_sample_model(tmp_path, "bloom")


def test_it_has_a_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path / "cli"), "--family", "gpt2", "--card"]) == 0
    assert [p.name for p in (tmp_path / "cli").iterdir()] == ["config.json"]
    assert "gpt2 card" in capsys.readouterr().out
