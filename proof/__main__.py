"""`python -m proof verify ...` / `python -m proof keygen ...`: see proof.signature."""

import sys

from proof.signature import main

sys.exit(main())
