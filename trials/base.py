"""The one interface every real trial backend implements (Megatron-core now, SGLang later).

`TrialBackend.run(plan, workload, resources)` returns a `Measurement` or a `Failure`; never raises
for a failing plan. Both are plain JSON-serialisable data, stored as Optuna trial attributes.
"""
from __future__ import annotations

import abc
from dataclasses import asdict, dataclass, field

# What a backend may report as the reason a plan failed. These are properties of the plan on this
# stack, so `moetune tune` never runs such a plan again (tuner/study/storage.py). A trial cut short because
# its tuner died or was interrupted is not one of them: the study records it as "interrupted".
FAILURE_KINDS = ("oom", "stack-rejected", "unrealizable", "crash", "timeout")


@dataclass(frozen=True)
class Measurement:
    plan: str  # canonical plan string actually run
    step_time_s: float  # median over timed iterations
    step_time_spread_s: float  # (max - min) over timed iterations
    step_times_s: tuple[float, ...]
    tokens_per_s_per_gpu: float
    peak_memory_gib: tuple[float, ...]  # per rank
    losses: tuple[float, ...] = ()
    versions: dict = field(default_factory=dict)
    backend: str = ""
    nodes: tuple[str, ...] = ()  # Ray node id of each rank, when run on Ray (multi-node trials)
    # seconds of one step per calibration class (cost_model.calibration.TRAIN_CLASSES), when the
    # backend could split its step (a profiled step); empty: the calibration fits the step total
    component_times_s: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["ok"] = True
        return d


@dataclass(frozen=True)
class Failure:
    plan: str
    kind: str  # one of FAILURE_KINDS
    message: str
    backend: str = ""
    nodes: tuple[str, ...] = ()  # Ray node id of each rank, when known

    def __post_init__(self) -> None:
        if self.kind not in FAILURE_KINDS:
            raise ValueError(f"unknown failure kind {self.kind!r}")

    def to_dict(self) -> dict:
        d = asdict(self)
        d["ok"] = False
        return d


@dataclass(frozen=True)
class Resources:
    """What a trial may use: devices (GPUs, or cores on cpu-local) and limits."""
    devices: int
    timeout_s: float = 600.0
    memory_cap_gib: float | None = None  # per rank; exceeding it is classified as OOM
    master_port: int | None = None  # None: pick a free port
    # ranks per Ray node when the trial spans nodes (trials/placement.py); None: all on this machine
    layout: tuple[int, ...] | None = None


class TrialBackend(abc.ABC):
    name: str = ""

    @abc.abstractmethod
    def run(self, plan, workload, resources: Resources, *, iters: int = 5,
            warmup: int = 2) -> Measurement | Failure:
        """Run `plan` for warmup + iters steps and measure it, or classify why it failed."""
