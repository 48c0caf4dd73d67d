"""What is being tuned: a model on a cluster at a global batch and sequence length."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from specs.errors import SpecError
from specs.model_spec import ModelSpec

if TYPE_CHECKING:  # specs sits below clusters: the type only, no import at run time
    from clusters import ClusterSpec


@dataclass(frozen=True)
class Workload:
    model: ModelSpec
    cluster: ClusterSpec
    gbs: int
    seq: int

    def __post_init__(self) -> None:
        if self.gbs <= 0:
            raise SpecError(f"--gbs must be positive, got {self.gbs}")
        if self.seq <= 0:
            raise SpecError(f"--seq must be positive, got {self.seq}")

    @property
    def world(self) -> int:
        return self.cluster.num_devices

    @property
    def tokens_per_step(self) -> int:
        return self.gbs * self.seq
