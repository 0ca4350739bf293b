"""Every random draw of a run derives from (seed, round, client, purpose): never a global stream.

That is what makes a run independent of how many ranks simulate it and lets it resume exactly.
"""
from __future__ import annotations

import numpy as np
import torch

from bench.core.errors import FedbenchError

# purposes of a draw, so that two draws of one client in one round never share a stream
SAMPLE_CLIENTS, SHUFFLE, AUGMENT, TORCH_GLOBAL, METHOD, SERVER, INIT = range(7)


def derive_seed(seed: int, round_idx: int, client: int, purpose: int) -> int:
    """A 63-bit seed that is a pure function of its arguments (numpy SeedSequence hashing)."""
    state = np.random.SeedSequence([int(seed), int(round_idx) + 1, int(client) + 2, int(purpose)]).generate_state(2)
    return int((int(state[0]) << 31) ^ int(state[1])) & ((1 << 63) - 1)


def torch_generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    return gen


def sample_size(num_clients: int, ratio: float) -> int:
    """How many clients a round samples: ratio * num_clients rounded, at least 1, at most all."""
    return min(num_clients, max(1, round(ratio * num_clients)))


def sample_clients(seed: int, round_idx: int, num_clients: int, ratio: float) -> list[int]:
    """The clients taking part in a round: identical on every rank, no communication needed."""
    if not 0.0 < ratio <= 1.0:
        raise FedbenchError(f"fed.sample_ratio must be in (0, 1], got {ratio}")
    m = sample_size(num_clients, ratio)
    if m == num_clients:
        return list(range(num_clients))
    rng = np.random.default_rng(derive_seed(seed, round_idx, -1, SAMPLE_CLIENTS))
    return sorted(int(c) for c in rng.choice(num_clients, size=m, replace=False))
