"""LKCC: the frozen language-knowledge classifier of FedCB / FedBM and its losses.

With h the L2-normalised feature and the class distributions N(mu_k, diag Sigma_k):
- ``lkcc_logits``          F(h, k) = tau h.mu_k + 0.5 tau^2 sum_i h_i^2 Sigma_k,ii   (appendix / code)
- ``lkcc_surrogate_loss``  CE(F(h), y) + 0.5 tau^2 sum_i h_i^2 Sigma_y,ii           (Eq. 4, upper bound)
- ``align_inf_monte_carlo`` Monte Carlo estimate of L_align^inf (Eq. 3) that Eq. 4 bounds
- ``embedding_average_logits`` tau h.mu_k (Eq. 1 with averaged embeddings, the ablation)
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def lkcc_logits(h: torch.Tensor, mu: torch.Tensor, sigma_diag: torch.Tensor, tau: float) -> torch.Tensor:
    """[B, K] logits tau * h.mu_k + 0.5 * tau^2 * sum_i h_i^2 Sigma_k,ii."""
    return tau * h @ mu.T + 0.5 * tau**2 * h.pow(2) @ sigma_diag.T


def lkcc_surrogate_loss(h: torch.Tensor, y: torch.Tensor, mu: torch.Tensor, sigma_diag: torch.Tensor,
                        tau: float, reduction: str = "mean") -> torch.Tensor:
    """The surrogate upper bound of L_align^inf (FedCB/FedBM Eq. 4), mean over the batch."""
    logits = lkcc_logits(h, mu, sigma_diag, tau)
    per_sample = F.cross_entropy(logits, y, reduction="none")
    per_sample = per_sample + 0.5 * tau**2 * (h.pow(2) * sigma_diag[y]).sum(dim=1)
    if reduction == "none":
        return per_sample
    if reduction != "mean":
        raise ValueError(f"reduction must be 'mean' or 'none', got {reduction!r}")
    return per_sample.mean()


def embedding_average_logits(h: torch.Tensor, mu: torch.Tensor, tau: float) -> torch.Tensor:
    """Eq. 1's classifier with averaged embeddings: tau * h.mu_k (no variance term)."""
    return tau * h @ mu.T


def align_inf_monte_carlo(h: torch.Tensor, y: torch.Tensor, mu: torch.Tensor, sigma_diag: torch.Tensor,
                          tau: float, n_samples: int, generator: torch.Generator | None = None,
                          inner_expectation: bool = True) -> torch.Tensor:
    """Monte Carlo estimate of L_align^inf (Eq. 3) with w_k ~ N(mu_k, diag Sigma_k).

    Eq. 3 has the expectation over the negatives inside the log:
        E_{w_y}[ -log( e^{tau h.w_y} / (e^{tau h.w_y} + sum_{k != y} E[e^{tau h.w_k}]) ) ],
    estimated here with the mean of e^{tau h.w_k} over the n_samples draws (log-sum-exp) and the
    outer expectation as the mean over draws of w_y. With ``inner_expectation=False`` it is the
    plain average of CE(tau h.w, y) over joint draws, which is <= Eq. 3 by Jensen.
    Draws are made on the generator's device (CPU by default) in float64.
    """
    b, d = h.shape
    k = mu.shape[0]
    draw_device = generator.device if generator is not None else torch.device("cpu")
    h64, mu64, sd64 = (t.detach().to(draw_device, torch.float64) for t in (h, mu, sigma_diag.sqrt()))
    y = y.to(draw_device)
    chunk = max(1, 2_000_000 // max(1, k * d))
    # s[n, k, b] = tau * h_b . w_k^(n): only these scores are needed, drawn chunk by chunk.
    scores = []
    for start in range(0, n_samples, chunk):
        n = min(chunk, n_samples - start)
        w = mu64 + sd64 * torch.randn(n, k, d, generator=generator, device=draw_device, dtype=torch.float64)
        scores.append(tau * torch.einsum("nkd,bd->nkb", w, h64))
    s = torch.cat(scores)  # [N, K, B]
    cols = torch.arange(b, device=draw_device)
    pos = s[:, y, cols]  # [N, B]: tau h_b . w_{y_b}^(n)
    if inner_expectation:
        log_mean_exp = torch.logsumexp(s, dim=0) - math.log(n_samples)  # [K, B]
        neg = log_mean_exp.clone()
        neg[y, cols] = -math.inf  # exclude the positive class from the negatives
        log_neg = torch.logsumexp(neg, dim=0)  # [B]
        total = torch.logaddexp(pos, log_neg.expand_as(pos)) - pos
    else:
        total = torch.logsumexp(s, dim=1) - pos
    return total.mean().to(device=h.device, dtype=h.dtype)
