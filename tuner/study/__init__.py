"""The study: screening, pre-registration, the trial loop, adjudication and the report, written once
over a mode (training or serving plans). Public vocabulary:

    run(options, mode) -> TuneResult      one tuner process of a study (tuner/study/skeleton.py)
    TuneOptions, TuneResult               how to run it, what it leaves (tuner/study/options.py)
    StudyMode                             what a study must know about its plans (tuner/study/modes.py)
    TrainMode, ServeMode, ServeTask       the two modes (tuner/study/train.py, tuner/study/serve.py)
"""
from tuner.study.modes import StudyMode
from tuner.study.options import TuneOptions, TuneResult
from tuner.study.serve import ServeMode, ServeTask
from tuner.study.skeleton import run
from tuner.study.train import TrainMode

__all__ = ["run", "TuneOptions", "TuneResult", "StudyMode", "TrainMode", "ServeMode", "ServeTask"]
