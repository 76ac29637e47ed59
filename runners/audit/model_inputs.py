"""The whole-model audit's inputs, derived alike by the parent (runners.modelaudit) and its workers
(runners.audit.model_worker): one round's token ids and the weights of the output commitments.
Pure: no state, nothing the candidate could change in the parent's copy.
"""

from __future__ import annotations

import numpy as np
import torch

from runners import suite

def round_tokens(phase: str, seed: int, *, vocab: int, calls: int, batch: int, seq: int) -> torch.Tensor:
    """Decode's prompt: one [batch, seq] set per call, of which decode prefills the first (its
    calls then extend that one cache, each by the token revealed with it).

    The parent draws `seed` per round and reveals it only in `prepare`; every worker of the round
    derives the same tokens from it. Prefill has no such pool: each call's whole token window
    travels in its own `step` request (a pool known in `prepare` let a worker precompute what does
    not depend on the window's offset, such as the first layer's projections of every token)."""
    width = seq
    rng = np.random.default_rng(suite.derive_seed(seed, phase, "tokens"))
    return torch.from_numpy(rng.integers(0, vocab, size=(calls, batch, width), dtype=np.int64))


def commit_weights(seed: int, width: int) -> torch.Tensor:
    """One weight per logit column (see row_commitments). Generated on the CPU so every device
    gets the same values."""
    return torch.randn(width, generator=torch.Generator().manual_seed(seed), dtype=torch.float32)


def row_commitments(output: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """What a worker commits to for one timed call, in the same reply that ends the call's window:
    sum(|row| * w) for every output row, a float32 vector sent as the reply's one tensor (raw
    bytes: as JSON numbers the 1,024 rows of a 2 x 512 prefill took 0.56 ms a call to write and
    read, inside every arm's window, which pulled every figure towards 1). The parent checks it
    later against rows it fetches (runners.measure.commitment_holds on |row|).

    Not sum(row * w): a model's last layer is linear, so that sum equals the hidden state times
    (head^T w), which a worker could commit to without ever computing the logits and then compute
    only the rows the parent fetches. The absolute value has no such shortcut."""
    flat = output.detach().reshape(-1, output.shape[-1]).to(torch.float32).abs()
    return flat @ weights.to(flat.device)
