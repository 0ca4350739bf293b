"""Per-class Gaussian concept distributions estimated from prompt embeddings (FedBM Eq. 2).

From K x M embeddings: ``mu`` (mean, not renormalised) and ``sigma_diag`` (unbiased
per-dimension variance) define the LKCC classifier; ``cov`` (full unbiased covariance + eps I)
is what the CGDE generator's conditions z ~ N(mu_c, cov_c) are drawn from.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from bench.core.errors import FedbenchError


@dataclass
class ConceptDistribution:
    """mu [K, D], sigma_diag [K, D], cov [K, D, D] and its Cholesky factor chol [K, D, D]."""

    mu: torch.Tensor
    sigma_diag: torch.Tensor
    cov: torch.Tensor
    chol: torch.Tensor

    @classmethod
    def from_embeddings(cls, embeddings: torch.Tensor, eps: float = 1e-4) -> ConceptDistribution:
        """Estimate the distributions from [K, M, D] embeddings (L2-normalised here; a no-op if
        they already are). Needs M >= 2 prompts per class for the unbiased variance."""
        if embeddings.ndim != 3:
            raise FedbenchError(f"embeddings must be [K, M, D], got {tuple(embeddings.shape)}")
        _, m, d = embeddings.shape
        if m < 2:
            raise FedbenchError(
                f"A concept distribution needs at least 2 prompts per class, got {m}: "
                "raise prompt_fraction or add templates."
            )
        e = F.normalize(embeddings.double(), dim=-1)
        mu = e.mean(dim=1)
        centred = e - mu.unsqueeze(1)
        sigma_diag = centred.pow(2).sum(dim=1) / (m - 1)
        eye = torch.eye(d, dtype=e.dtype, device=e.device)
        cov = centred.transpose(1, 2) @ centred / (m - 1) + eps * eye
        chol = torch.linalg.cholesky(cov)
        dtype = embeddings.dtype if embeddings.is_floating_point() else torch.float32
        return cls(mu.to(dtype), sigma_diag.to(dtype), cov.to(dtype), chol.to(dtype))

    @property
    def num_classes(self) -> int:
        return self.mu.shape[0]

    @property
    def dim(self) -> int:
        return self.mu.shape[1]

    def to(self, device: torch.device | str, dtype: torch.dtype | None = None) -> ConceptDistribution:
        """A copy with every tensor on ``device`` (and in ``dtype`` when given)."""
        return ConceptDistribution(*(t.to(device, dtype) for t in (self.mu, self.sigma_diag, self.cov, self.chol)))

    def sample(self, labels: torch.Tensor, generator: torch.Generator | None = None,
               noise_only: bool = False) -> torch.Tensor:
        """One z [B, D] per label: z ~ N(mu_y, cov_y), or plain N(0, I) when ``noise_only``.

        The standard-normal draw is made on the generator's device (so a CPU generator gives the
        same numbers on every device and rank) and then moved to ``mu``'s device.
        """
        draw_device = generator.device if generator is not None else self.mu.device
        noise = torch.randn(len(labels), self.dim, generator=generator, device=draw_device,
                            dtype=self.mu.dtype).to(self.mu.device)
        if noise_only:
            return noise
        labels = labels.to(self.mu.device)
        if labels.device.type != "cpu":  # one batched product: no per-class unique()/mask read back per step
            return self.mu[labels] + torch.bmm(self.chol[labels], noise.unsqueeze(-1)).squeeze(-1)
        # on the CPU the per-class products the regression references were measured with (same values up
        # to float rounding; tests/perf/test_gpu_paths.py)
        z = self.mu[labels].clone()
        for c in labels.unique():
            rows = labels == c
            z[rows] += noise[rows] @ self.chol[c].T
        return z
