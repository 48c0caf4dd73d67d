"""The SMs HybridEP runs on (issue 22 item 1): one count, NVIDIA's performance recipes' 32
(`specs.stack.HYBRIDEP_NUM_SMS`), is what the emitted script and the trial's TransformerConfig set;
megatron-core's own default (16) is neither. HybridEP launches its kernels as plain grids, so
under overlap the compute keeps the SMs and the communication is starved (`constants`
COMM_STARVED, STARVED_WORK_PER_PAIRED_S): the cost model charges the compute no SM share for it."""
import shlex

import pytest

import cost_model
from clusters import load_cluster
from specs.models import load_model
from specs.stack import GPU_FULL, HYBRIDEP_NUM_SMS
from specs.workload import Workload
from tuner.emit.megatron import megatron_script
from tuner.rank.complete import complete_plan

MCORE_DEFAULT_HYBRIDEP_SMS = 16  # megatron-core 0.16.1 transformer_config.py moe_hybridep_num_sms


def _w():
    return Workload(load_model("qwen3-30b-a3b"), load_cluster("h100-sxm", 16), 1024, 4096)


def _flag(script: str, name: str):
    toks = shlex.split(script.replace("\\\n", " "))
    return [toks[i + 1] for i, t in enumerate(toks) if t == name]


def test_the_recipes_count_is_not_megatron_cores_default():
    assert HYBRIDEP_NUM_SMS == 32 != MCORE_DEFAULT_HYBRIDEP_SMS


def test_emitted_hybridep_plan_sets_the_priced_sm_count():
    w = _w()
    hyb = complete_plan("ep=16,dispatcher=flex,flex_backend=hybridep,a2a_overlap=1", w, GPU_FULL)
    deep = complete_plan("ep=16,dispatcher=flex,flex_backend=deepep,a2a_overlap=1", w, GPU_FULL)
    assert _flag(megatron_script(w, hyb, GPU_FULL), "--moe-hybridep-num-sms") == [str(HYBRIDEP_NUM_SMS)]
    assert _flag(megatron_script(w, deep, GPU_FULL), "--moe-hybridep-num-sms") == []


def test_overlapped_hybridep_is_starved_not_holding_sms():
    """Under a2a overlap HybridEP's communication trickles beside the paired compute
    (blocks.paired_exposure, not held): no SM share charged to the compute, and the exposed
    communication at least comm - rate x (all the compute the pairs could hide it under)."""
    from cost_model.constants import STARVED_WORK_PER_PAIRED_S
    w = _w()
    base = complete_plan("ep=16,dispatcher=flex,flex_backend=hybridep", w, GPU_FULL)
    plain, ovl = cost_model.predict_many(w, [base, base.replace(a2a_overlap=True)])
    comm = plain.breakdown_s["ep_dispatch_combine"]
    assert ovl.breakdown_s["ep_overlap_sm_share"] == 0.0
    beyond = ovl.breakdown_s["ep_overlap_beyond"]
    assert 0.0 < beyond < comm
    # the pairs' compute is at most the whole step's: the starved rate bounds what hides
    assert beyond >= comm * (1 - 1 / 64) - STARVED_WORK_PER_PAIRED_S * plain.step_time_s


def test_trial_config_holds_the_same_sms():
    """The trial's TransformerConfig (megatron-core's own dataclass) carries the count the emitted
    flag sets, for HybridEP only."""
    pytest.importorskip("megatron.core")
    from trials.megatron.model import transformer_config
    w = _w()
    for backend, want in (("hybridep", HYBRIDEP_NUM_SMS), ("deepep", MCORE_DEFAULT_HYBRIDEP_SMS)):
        p = complete_plan(f"ep=16,dispatcher=flex,flex_backend={backend}", w, GPU_FULL)
        cfg = transformer_config(w.model, p, on_gpu=False, seq=w.seq)
        assert cfg.moe_hybridep_num_sms == want
