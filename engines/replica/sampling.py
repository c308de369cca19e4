"""Choosing the next token from the last position's logits: greedy, or temperature / top-p."""

from __future__ import annotations

import torch

from kvgate.engines.replica.types import SamplingParams


def generator(params: SamplingParams) -> torch.Generator | None:
    """The request's random source: None when greedy (nothing is drawn), seeded when `seed` is
    given (same seed, same prompt → same answer), else seeded from the OS."""
    if not params.temperature:
        return None
    gen = torch.Generator()
    if params.seed is not None:
        gen.manual_seed(params.seed)
    else:
        gen.seed()
    return gen


def sample(logits: torch.Tensor, params: SamplingParams, gen: torch.Generator | None) -> int:
    """The next token id. Greedy (temperature None or 0): the argmax, no randomness drawn.
    Otherwise a draw from softmax(logits / temperature) restricted to the smallest set of most
    likely tokens whose mass reaches top_p (never empty: the most likely token always stays)."""
    if not params.temperature:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits.float() / params.temperature, dim=-1)
    if params.top_p < 1.0:
        sorted_p, order = torch.sort(probs, descending=True)
        drop = torch.cumsum(sorted_p, dim=-1) - sorted_p >= params.top_p  # mass before it: keeps the first
        sorted_p[drop] = 0.0
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_p)
    return int(torch.multinomial(probs, 1, generator=gen))
