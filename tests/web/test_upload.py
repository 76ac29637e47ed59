"""Model uploads in the web UI and the service: accepted kinds, refusals, nothing left behind."""

from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from auditlog.models import AuditEvent
from catalog.models import Model, ModelFile, ModelVersion

from .helpers import folder_uploads, zip_of

pytestmark = pytest.mark.django_db

OWNER = {"username": "owner@acme.test", "password": "correct-horse-battery"}


@pytest.fixture
def owner_client(client, make_org, media_root):
    make_org("acme", owner=OWNER["username"])
    client.login(**OWNER)
    return client


def _nothing_kept(media_root: Path) -> None:
    assert ModelVersion.objects.count() == 0 and ModelFile.objects.count() == 0
    kept = [p for p in media_root.rglob("*") if p.is_file()]
    assert kept == [], kept


def test_it_accepts_a_hugging_face_folder_and_hashes_every_file(owner_client, sample_models, media_root):
    import hashlib

    folder = sample_models["llama"]
    response = owner_client.post(reverse("front:upload"),
                                 {"name": "tiny-llama", "files": folder_uploads(folder)})
    assert response.status_code == 302
    version = ModelVersion.objects.get()
    assert (version.kind, version.family, version.number) == ("weights", "llama", 1)
    assert version.parameter_count > 0
    for path in folder.iterdir():
        kept = version.files.get(path=path.name)
        assert kept.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
        assert (media_root / version.storage_dir / path.name).read_bytes() == path.read_bytes()
    assert AuditEvent.objects.filter(action="model.uploaded").count() == 1


def test_it_numbers_versions_of_the_same_model(owner_client, sample_models):
    for _ in range(2):
        owner_client.post(reverse("front:upload"),
                          {"name": "tiny", "files": folder_uploads(sample_models["llama"])})
    assert list(Model.objects.get(name="tiny").versions.values_list("number", flat=True)) == [2, 1]


def test_it_accepts_an_architecture_card(owner_client, sample_models):
    response = owner_client.post(reverse("front:upload"),
                                 {"name": "card", "files": folder_uploads(sample_models["llama-card"])})
    assert response.status_code == 302
    assert ModelVersion.objects.get().kind == "card"


def test_it_accepts_a_zip_of_the_folder(owner_client, sample_models):
    archive = SimpleUploadedFile("model.zip", zip_of(sample_models["llama"]))
    response = owner_client.post(reverse("front:upload"), {"name": "zipped", "files": [archive]})
    assert response.status_code == 302, response.content[:2000]
    assert {f.path for f in ModelVersion.objects.get().files.all()} == {
        p.name for p in sample_models["llama"].iterdir()}


@pytest.mark.parametrize("filename", ["pytorch_model.bin", "model.pt", "model.pth", "weights.pkl", "last.ckpt"])
def test_it_refuses_pickle_formats_with_the_reason(owner_client, sample_models, media_root, filename):
    files = folder_uploads(sample_models["llama"]) + [SimpleUploadedFile(filename, b"\x80\x04K\x01.")]
    response = owner_client.post(reverse("front:upload"), {"name": "pickled", "files": files})
    assert response.status_code == 400
    text = response.content.decode()
    assert "safetensors" in text and "code" in text.lower()
    _nothing_kept(media_root)


def test_it_refuses_an_oversized_file(owner_client, sample_models, media_root, settings):
    settings.DYNO_UPLOAD_MAX_FILE_BYTES = 1000
    response = owner_client.post(reverse("front:upload"),
                                 {"name": "big", "files": folder_uploads(sample_models["llama"])})
    assert response.status_code == 400 and b"too_large" in response.content
    _nothing_kept(media_root)


def test_it_refuses_truncated_safetensors(owner_client, sample_models, media_root):
    folder = sample_models["llama"]
    data = (folder / "model.safetensors").read_bytes()
    files = [SimpleUploadedFile("config.json", (folder / "config.json").read_bytes()),
             SimpleUploadedFile("model.safetensors", data[: len(data) // 2])]
    response = owner_client.post(reverse("front:upload"), {"name": "cut", "files": files})
    assert response.status_code == 400 and b"bad_safetensors" in response.content
    _nothing_kept(media_root)


def test_it_refuses_invalid_json(owner_client, media_root):
    response = owner_client.post(reverse("front:upload"),
                                 {"name": "broken", "files": [SimpleUploadedFile("config.json", b"{not json")]})
    assert response.status_code == 400 and b"invalid_json" in response.content
    _nothing_kept(media_root)


def test_it_refuses_an_unknown_architecture(owner_client, media_root):
    config = b'{"model_type": "totally-new-arch", "hidden_size": 8}'
    response = owner_client.post(reverse("front:upload"),
                                 {"name": "unknown", "files": [SimpleUploadedFile("config.json", config)]})
    assert response.status_code == 400 and b"unknown_architecture" in response.content
    _nothing_kept(media_root)


def test_it_refuses_a_zip_that_climbs_out(owner_client, media_root):
    import io
    import zipfile

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("../../escape.json", "{}")
    response = owner_client.post(reverse("front:upload"),
                                 {"name": "evil", "files": [SimpleUploadedFile("evil.zip", buffer.getvalue())]})
    assert response.status_code == 400
    _nothing_kept(media_root)
    assert not (media_root.parent / "escape.json").exists()


def test_it_refuses_an_empty_upload(owner_client, media_root):
    response = owner_client.post(reverse("front:upload"), {"name": "nothing"})
    assert response.status_code == 400 and b"empty" in response.content
