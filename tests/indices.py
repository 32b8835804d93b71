"""A dataset whose samples are their own indices: what a sampler or loader yields, made visible."""

from __future__ import annotations

from torch.utils.data import Dataset


class Indices(Dataset[int]):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i
