"""The project layout rules that keep Django importable."""

import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_it_keeps_platform_the_standard_library_module():
    import platform

    stdlib = Path(sysconfig.get_paths()["stdlib"]).resolve()
    assert Path(platform.__file__).resolve().parent == stdlib
    assert callable(platform.python_version)


def test_it_has_no_platform_package_marker():
    assert (ROOT / "platform").is_dir()
    assert not (ROOT / "platform" / "__init__.py").exists()


def test_it_imports_uuid_and_django_with_platform_on_the_path():
    import uuid

    import django

    assert uuid.uuid4().version == 4
    assert django.VERSION[0] >= 5
