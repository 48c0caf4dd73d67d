"""What a study must know about its plans: the `StudyMode` interface.

One study skeleton (tuner/study/skeleton.py `run`: screening -> pre-registration -> trials -> adjudication ->
report; tuner/study/loop.py: the trial loop) runs over a mode; a mode holds what is tuned (the
workload or serving task, the stack, the precision, the cost model's tables and calibration) and
answers the few questions whose answers differ between training and serving plans. The two
implementations are `tuner.study.train.TrainMode` (Megatron training plans) and
`tuner.study.serve.ServeMode` (SGLang / vLLM serving plans).

Currency: every mode's "step time" is the seconds the objective costs, the quantity the sampler
and the calibration see and that the study records as `*_step_time_s`: a training step for
training, seconds per objective token per GPU for serving (1 / tokens/s/GPU).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

SAMPLER = "guided-ei"  # the proposer every study pre-registers (tuner/study/sampler.py)


@dataclass(frozen=True)
class Screening:
    """What screening found: `total` realizable plans, the kept `pool` best first (the mode's own
    rows), `space` the pre-registration's description of what was screened, `seconds` it took."""
    total: int
    pool: list
    space: dict
    seconds: float = 0.0


class StudyMode(ABC):
    """The training / serving half of a study. Attributes every mode sets:

    name: "train" or "serve" (the study's user attribute `mode`).
    workload: what a trial runs; needs `world` (devices a trial holds), `cluster` and `model`
        (their digests go into the pre-registration).
    precision: the precision asked for (pre-registered).
    tables, calibration: the cost model's inputs; `calibration` is where the study starts from
        (the trial loop refits it on every measured trial).
    multi_node: whether a trial wider than one Ray node runs through a placement group.
    """

    name: str
    multi_node: bool
    workload: object
    precision: str
    tables: object
    calibration: object

    # the Ray task body of one trial ------------------------------------------------------------
    @staticmethod
    @abstractmethod
    def run_trial(backend: str, plan_text: str, workload, iters: int, warmup: int, timeout_s: float,
                  memory_cap_gib: float | None, layout: tuple[int, ...] | None = None) -> dict:
        """Run `plan_text` on `backend`; a dict the study records (`ok`, `step_time_s`,
        `tokens_per_s_per_gpu`, ... or `kind` / `message` of the failure). A staticmethod: it is
        shipped to Ray as a plain function."""

    # screening and pre-registration ------------------------------------------------------------
    @abstractmethod
    def screen(self, options) -> Screening:
        """Score the plan space with the cost model; UsageError when no plan fits. Ray is up."""

    @abstractmethod
    def baseline(self, options) -> tuple[dict, str]:
        """(the baseline's pre-registration entry: plan and predictions, where it came from):
        `options.baseline` checked and priced, or the mode's hand-tuned plan; UsageError if the
        plan cannot run."""

    @abstractmethod
    def entry(self, row) -> dict:
        """A pool row's pre-registration entry: `plan` and its `predicted_*` values."""

    @abstractmethod
    def layout(self, row) -> tuple:
        """A pool row's parallel layout (candidates cover distinct layouts first)."""

    def workload_fields(self) -> dict | None:
        """The pre-registration's `workload` entry; None: prereg.build's training default."""
        return None

    def adjudication(self, options) -> dict | None:
        """The pre-registered adjudication protocol (tuner/study/verdict.py), or None: the single
        measurements' ratio decides."""
        return None

    # the trial loop ----------------------------------------------------------------------------
    @abstractmethod
    def predict(self, plan: str) -> tuple[float, dict]:
        """(the cost model's raw step time of `plan`, extra trial attributes of the prediction)."""

    @abstractmethod
    def tokens_per_s_per_gpu(self, step_s: float) -> float:
        """The throughput a step time stands for."""

    @abstractmethod
    def sampler(self, pool):
        """The guided sampler (tuner.study.sampler.GuidedSampler) over the screened pool."""

    # the report --------------------------------------------------------------------------------
    @abstractmethod
    def write_report(self, study_dir: Path, *, prereg: dict, rows: list[dict], backend: str, calibration,
                     cal_report, wall_s: float, storage_url: str, remeasured: list[dict],
                     pool: list | None) -> Path:
        """Write the study's report into `study_dir` (storage_url already redacted; `pool` given
        for a predict-only run); returns report.md's path."""
