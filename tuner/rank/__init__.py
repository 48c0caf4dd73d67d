"""The cost model over many plans: ranking, completion, baselines, what-ifs. Public vocabulary:

    rank_plans, rank_space, rank_space_top, screen, Scored   training ranking and Ray screening (tuner/rank/train.py)
    complete, complete_plan                                  a partial training plan made whole (tuner/rank/complete.py)
    complete_serve                                           a partial serving plan made whole (tuner/rank/serve_complete.py)
    hand_tuned_baseline, given_baseline                      the training baseline (tuner/rank/baseline.py)
    select_candidates                                        the plans a study pre-registers (tuner/rank/candidates.py)

Modules inside tuner/ import the defining module itself (the package's own modules load in any order).
"""
from tuner.rank.baseline import given_baseline, hand_tuned_baseline
from tuner.rank.candidates import select_candidates
from tuner.rank.complete import complete, complete_plan
from tuner.rank.serve_complete import complete_serve
from tuner.rank.train import Scored, rank_plans, rank_space, rank_space_top, screen

__all__ = ["rank_plans", "rank_space", "rank_space_top", "screen", "Scored", "complete", "complete_plan",
           "complete_serve", "hand_tuned_baseline", "given_baseline", "select_candidates"]
