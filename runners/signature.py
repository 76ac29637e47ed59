"""The verifier's former home, kept so that `python -m runners.signature verify ...`, printed in
reports signed before the verifier moved to `proof/`, still works. New code imports
`proof.signature`; this module only re-exports it and runs its command line."""

import sys

from proof.signature import *  # noqa: F401,F403
from proof.signature import main

if __name__ == "__main__":
    sys.exit(main())
