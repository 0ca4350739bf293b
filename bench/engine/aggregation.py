"""One flat float64 buffer per round: weighted shared state, total weight, extras, error flag.

Each rank adds its clients into the buffer; ONE all_reduce(SUM) aggregates everything.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class FlatLayout:
    """Where each named tensor lives in the flat buffer."""

    names: list[str]
    shapes: list[torch.Size]
    offsets: list[int]
    size: int

    @classmethod
    def build(cls, shapes: dict[str, tuple[int, ...] | torch.Size]) -> FlatLayout:
        names, sizes, offsets, pos = [], [], [], 0
        for name, shape in shapes.items():
            shape = torch.Size(shape)
            names.append(name)
            sizes.append(shape)
            offsets.append(pos)
            pos += shape.numel()
        return cls(names, sizes, offsets, pos)

    def add(self, buf: torch.Tensor, tensors: dict[str, torch.Tensor], weight: float = 1.0) -> None:
        """buf[slot(name)] += weight * tensor, in float64."""
        for name, off, shape in zip(self.names, self.offsets, self.shapes):
            if name in tensors:
                t = tensors[name].detach()
                if t.shape != shape:
                    raise ValueError(f"upload {name!r} has shape {tuple(t.shape)}, declared {tuple(shape)}")
                buf[off : off + shape.numel()].add_(t.reshape(-1).to(torch.float64), alpha=weight)

    def unpack(self, buf: torch.Tensor) -> dict[str, torch.Tensor]:
        return {n: buf[o : o + s.numel()].view(s) for n, o, s in zip(self.names, self.offsets, self.shapes)}


class RoundBuffer:
    """The round's flat buffer: [shared state | weight | extras | failures]."""

    def __init__(self, state_shapes: dict[str, torch.Size], extra_shapes: dict[str, tuple[int, ...]], device) -> None:
        self.state = FlatLayout.build(state_shapes)
        self.extras = FlatLayout.build(extra_shapes)
        self.weight_at = self.state.size
        self.extras_at = self.weight_at + 1
        self.fail_at = self.extras_at + self.extras.size
        self.buf = torch.zeros(self.fail_at + 1, dtype=torch.float64, device=device)

    def add_client(self, state: dict[str, torch.Tensor], weight: float, extras: dict[str, torch.Tensor]) -> None:
        self.state.add(self.buf[: self.state.size], state, weight)
        self.buf[self.weight_at] += weight
        self.extras.add(self.buf[self.extras_at : self.fail_at], extras)

    def add_extras(self, extras: dict[str, torch.Tensor]) -> None:
        """Add uploads that belong to no client (a rank's own timings)."""
        self.extras.add(self.buf[self.extras_at : self.fail_at], extras)

    def mark_failure(self) -> None:
        self.buf[self.fail_at] += 1

    @property
    def failures(self) -> int:
        return int(self.buf[self.fail_at].item())

    @property
    def total_weight(self) -> float:
        return float(self.buf[self.weight_at].item())

    def averaged_state(self) -> dict[str, torch.Tensor]:
        return self.state.unpack(self.buf[: self.state.size] / self.total_weight)

    def summed_extras(self) -> dict[str, torch.Tensor]:
        return self.extras.unpack(self.buf[self.extras_at : self.fail_at])


def copy_into(dst: dict[str, torch.Tensor], src: dict[str, torch.Tensor]) -> None:
    """dst[k] <- src[k] in place, casting (rounding for integer buffers such as BN counters)."""
    for k, t in src.items():
        d = dst[k]
        if d.dtype.is_floating_point:
            d.copy_(t)
        else:
            d.copy_(torch.round(t))


def client_metrics_row(num_clients: int, client: int, scores: list[float], device) -> torch.Tensor:
    """Client ``client``'s evaluation scores as its upload to the round's per-client metrics table:
    a (num_clients, len(scores) + 1) float64 tensor, zero except row ``client`` = [scores..., 1] (the last
    column counts the clients evaluated). Built on ``device``, the round buffer's: adding a CPU table
    into a CUDA buffer is an error."""
    row = torch.zeros(num_clients, len(scores) + 1, dtype=torch.float64, device=device)
    row[client, :-1] = torch.tensor(scores, dtype=torch.float64, device=device)
    row[client, -1] = 1.0
    return row
