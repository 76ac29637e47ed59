"""Selective scan without a Python loop over time: the state recurrence unrolled with cumulative
sums in log space (fine for short sequences; memory grows with L^2)."""
import torch


def kernel(u, delta, A, B, C, D):
    dtype = u.dtype
    u, delta, A, B, C, D = (t.float() for t in (u, delta, A, B, C, D))
    decay = torch.cumsum(delta.unsqueeze(-1) * A[None, :, None, :], dim=2)  # [b, d, l, n]
    # state_t = sum_{s<=t} exp(decay_t - decay_s) * delta_s * u_s * B_s
    length = u.shape[-1]
    causal = torch.ones(length, length, dtype=torch.bool, device=u.device).tril()
    gaps = (decay.unsqueeze(3) - decay.unsqueeze(2)).masked_fill(~causal[None, None, :, :, None], float("-inf"))
    weights = torch.exp(gaps)  # [b, d, t, s, n]; zero above the diagonal
    inject = (delta * u).unsqueeze(-1) * B.transpose(1, 2)[:, None]  # [b, d, s, n]
    state = torch.einsum("bdtsn,bdsn->bdtn", weights, inject)
    y = torch.einsum("bdtn,bnt->bdt", state, C)
    return (y + u * D[None, :, None]).to(dtype)
