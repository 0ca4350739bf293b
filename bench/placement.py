"""Which rank trains which of a round's sampled clients.

A client whose method keeps state for it between rounds (personal parts, ``ctx.state``, a carried-over
optimizer) trains where that state lives: rank c % N. When the method keeps none, a client may train
on any rank, and the round's clients are spread to even out the ranks' work: largest first, each onto
the rank with the fewest samples so far (ties: the lower rank). With 5 sampled clients on 2 ranks the
split by c % N can be 4:1; by samples it is as even as the client sizes allow.

The assignment is a pure function of the sampled clients and their sizes, so every rank computes the
same one without communication; and it changes no number: each client's training derives every draw
from (seed, round, client), and the aggregate is one float64 sum over all clients.
"""
from __future__ import annotations


def assign_clients(sampled: list[int], sizes: list[int], world: int, movable: bool) -> list[list[int]]:
    """The clients each rank trains this round, each list in ``sampled`` order; ``sizes[c]`` is client
    c's number of training samples (its share of the work)."""
    ranks: list[list[int]] = [[] for _ in range(world)]
    if not movable or world == 1:
        for c in sampled:
            ranks[c % world].append(c)
        return ranks
    load = [0] * world
    for c in sorted(sampled, key=lambda c: (-sizes[c], c)):
        r = min(range(world), key=lambda r: (load[r], r))
        ranks[r].append(c)
        load[r] += sizes[c]
    order = {c: i for i, c in enumerate(sampled)}
    return [sorted(cs, key=order.__getitem__) for cs in ranks]
