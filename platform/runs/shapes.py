"""The shapes a run may measure: one place for the run form, the API and the contracts' plans."""

MAX_BATCH = 64
MAX_SEQ = 8192
