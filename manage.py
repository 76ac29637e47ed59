#!/usr/bin/env python
"""Django's command-line entry point for Dyno.

`platform/` is a source root, not a package (a package named `platform` would shadow the
standard library module that `uuid`, and so Django, imports), so it goes on sys.path here.
"""

import os
import sys
from pathlib import Path


def main() -> None:
    root = Path(__file__).resolve().parent
    for path in (str(root / "platform"), str(root)):
        if path not in sys.path:
            sys.path.insert(0, path)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "dyno.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
