"""Serving physics behind large-scale EP prefill and attention DP (issue 23): DeepEP normal kernels
cross RDMA once per node a token reaches; packed prompts attend only to themselves; the shared
expert runs whole on each rank under DeepEP; attention-DP ranks wait for each other's prefills."""
import numpy as np
import pytest

from clusters import load_cluster
from cost_model.blocks import distinct_domains, ep_wire_seconds
from cost_model.serving import rank_arrays
from cost_model.serving.calibration import IDENTITY
from cost_model.serving.plans import effective_plans, to_cols
from cost_model.serving.step import StepModel, context_split
from cost_model.tables import load_tables, tables_dir_for
from specs.models import load_model
from specs.serve_plan import ServePlan, ServeWorkload

DSV3 = load_model("deepseek-v3")
H100_32 = load_cluster("h100-sxm", 32)
H200 = load_cluster("h200-sxm", 8)
LMSYS = "tp=32,attn_dp=32,a2a=deepep,deepep_mode=normal,eplb_redundant=32,chunked_prefill=524288"


def _step(text, cluster, fp8=True):
    c = to_cols(effective_plans([ServePlan.parse(text)], DSV3, cluster))
    return StepModel(DSV3, cluster, load_tables(tables_dir_for(cluster.kind)), c, fp8=fp8)


def test_deepep_normal_crosses_rdma_once_per_node_reached():
    """DeepEP's README rates count one copy per node a token reaches (tests/test_internode.py:
    num_rdma_token_sent); NVLink fans the copies out there. At EP32 over 4 H100 nodes DeepSeek-V3
    (group-limited: 4 of 8 groups, two groups per node) reaches ~3.1 nodes, not 8 x 3/4 = 6 remote
    top-k copies: the RDMA leg, which bounds the step, costs about half of the all-copies price."""
    sm = _step(LMSYS, H100_32)
    tok = 16384.0  # tokens per rank of LMSYS's 524288-token chunk over 32 ranks
    comm, _ = sm._comm(np.array([tok * 32]))
    d, c, _, _ = ep_wire_seconds(DSV3, sm.ops, np.array([2]), tok, DSV3.hidden_size, np.array([True]), sm.c.ep, 1)
    assert comm[0] == pytest.approx(d[0] + c[0])  # attention TP 1: no all-reduce beside it
    reached = distinct_domains(DSV3, 256, 8, np.array([32.0]), np.array([8.0]))[0] * 4 / 3
    assert 2.9 < reached < 3.4
    # the all-copies price: every top-k copy whose expert lives on another node, on the RDMA rates
    bd, bc = tok * 8 * DSV3.hidden_size * 1.0, tok * 8 * DSV3.hidden_size * 2.0
    old_d, old_c = sm.ops.ep_dispatch(np.array([2]), bd, bc, sm.c.ep, 1)
    assert (old_d[0] + old_c[0]) / comm[0] > 1.6


def test_packed_prompts_attend_only_to_themselves():
    """A prefill chunk holding 16 prompts of 512 tokens does 1/16 of the causal attention work of one
    8192-token prompt (SGLang's extend attention is variable-length: prompts do not see each other)."""
    sm = _step("tp=8", H200)
    C = np.array([8192.0])
    one = sm._prefill_gpu(C, 0.0, C, 1.0)[2]["attention"][0]
    packed = sm._prefill_gpu(C, 0.0, np.array([512.0]), 1.0)[2]["attention"][0]
    proj = sm.layers * sm._floor(sm._gemm(C, sm.attn_params), sm.kernels.proj)[0]
    assert packed < one
    assert (one - proj) / (packed - proj) > 6  # ~16 x the FLOPs; the table's rate moves a little
    # the simulator's (tokens, mean context) maps onto (prefix, segment) without changing the work
    assert context_split(8192.0, 4096.0) == (0.0, 8192.0)
    assert context_split(8192.0, 6096.0) == (2000.0, 8192.0)
    assert context_split(8192.0, 256.0) == (0.0, 512.0)
    # rank_arrays: a chunk longer than the prompt packs prompts, it does not run one long sequence
    w = ServeWorkload(isl=512, osl=1, concurrency=64, phase="prefill")
    packed_rate = rank_arrays(DSV3, H200, [ServePlan.parse("tp=8")], w, precision="fp8",
                              calibration=IDENTITY)["input_tokens_per_s_per_gpu"][0]
    sm1 = _step("tp=8", H200)
    C1 = float(sm1.c.chunk[0])
    one_seq_rate = C1 / float(sm1.prefill(C1, 0.0)[0][0]) / 8
    assert packed_rate > 1.05 * one_seq_rate


def test_shared_expert_is_whole_on_each_rank_under_deepep():
    """sglang models/deepseek_v2.py keeps the shared expert unsharded with DeepEP (tp_size=1): each
    rank runs [its tokens, 7168] x [7168, 4096], not the thin [all tokens, 7168] x [7168, 4096 / 32]."""
    ep, plain = _step(LMSYS, H100_32), _step("tp=32,attn_dp=32", H100_32)
    T = np.array([16384.0 * 32])
    pl = ep.pc["per_layer"]
    whole = ep._gemm(T / 32, pl["shared_expert"] + pl["router"])
    assert ep._shared(T)[0] == pytest.approx(np.ravel(whole)[0])
    assert ep._shared(T)[0] < 0.5 * plain._shared(T)[0]


def test_attention_dp_ranks_pay_each_others_prefills():
    """In a closed loop at 1k/1k each decode step of an 8-rank attention-DP instance completes
    8 x 8 / 1000 < 1 request: its replacement is extended alone, and the step lasts that extend for
    all eight ranks (their MoE layers run in lock step), the seven others still making their decode
    tokens in it. A rank's TPOT therefore carries about eight one-rank extends per osl / B of its
    own requests (less its decode step in each), not one eighth of an all-rank extend."""
    text = "tp=8,attn_dp=8,ep=8"
    sm = _step(text, H200)
    w = ServeWorkload(isl=1000, osl=1000, concurrency=64)
    r = rank_arrays(DSV3, H200, [ServePlan.parse(text)], w, precision="fp8", calibration=IDENTITY)
    B = float(r["batch_rank"][0])
    t_dec = float(sm.decode(np.array([B]), 1500.0)[0][0])
    solo = float(sm.prefill(np.array([1000.0]), 0.0, 1000.0, 1.0)[0][0])
    aligned = float(sm.prefill(np.array([1000.0]), 0.0, 1000.0)[0][0]) / 8  # one rank's share of an all-rank extend
    # first order in B / osl (0.8% of the steps are a rank's own extends); the extend step also
    # carries the seven other ranks' decode tokens through the MoE layers, which the one-rank
    # `solo` leaves out (at the Triton fused_moe's compute ceiling, on rows padded to its tile,
    # they cost ~15% more than it)
    assert float(r["tpot_s"][0]) - t_dec == pytest.approx(B / 1000 * 8 * (solo - t_dec), rel=0.2)
    assert 8 * solo > 3 * aligned


def test_extend_share_follows_the_ranks_independent_extends():
    """`extend_share`: one rank (no neighbours) is the plain closed loop; at light load a step holds
    an extend about attn_dp times as often as a rank extends, one rank at a time; when every rank
    extends every other step (2.56 completions per decode step, packed into one chunk) about half
    of them extend together."""
    from cost_model.serving import extend_share
    q, p, r, C = (float(x) for x in extend_share(1, 8, 1000, 1000, 8192))
    assert p == pytest.approx(q) and r == pytest.approx(1.0) and C == 1000.0
    q, p, r, C = (float(x) for x in extend_share(8, 8, 1000, 1000, 8192))
    assert q == pytest.approx(0.008 / 1.008) and p == pytest.approx(8 * q, rel=0.04) and r == pytest.approx(1.0, abs=0.04)
    q, p, r, C = (float(x) for x in extend_share(8, 256, 1000, 100, 8192))
    assert C == 2560.0 and q == pytest.approx(0.5) and p == pytest.approx(1 - 0.5 ** 8) and r == pytest.approx(4.0, rel=0.01)


def test_simulated_attention_dp_rank_waits_out_its_neighbours_extends():
    """The one-rank simulation of a closed loop: an extend of its own with nothing else queued is
    followed by the others' (prefill_stall of them), which hold its next decode steps to their
    length (it still makes its tokens) but not its own first tokens; a rank with a queue extends
    with the others in one step (priced by prefill_aligned_t) and none follow."""
    from cost_model.serving.sim import simulate

    def run(stall, stagger=0.0, dec=0.02, aligned=None):
        return simulate(lambda t, x: 0.1, lambda b, x: dec, [(0.0, 1000, 50)], chunk=4096, max_batch=8,
                        kv_tokens=1e9, closed_loop=8, total=32, stagger_s=stagger, prefill_stall=stall,
                        prefill_aligned_t=aligned)
    # arrivals spread beyond a request's life (1.08 s): extends mostly alone, each followed by
    # three decode steps at the extend's 0.1 s instead of 0.02 s
    r0, r3 = run(0.0, stagger=2.0), run(3.0, stagger=2.0)
    assert r3["makespan_s"] > r0["makespan_s"] + 0.6 * 3 * 0.08 * 32
    assert r3["makespan_s"] <= r0["makespan_s"] + 3 * 0.08 * 32 + 1e-9
    assert r3["ttft"][0] == pytest.approx(r0["ttft"][0])  # the first extend: no wait before it
    # all eight at t=0, four prompts per step: the first step of each wave leaves four queued
    # (every rank has a queue: they extend together), only the second is followed by the others'
    b0, b3 = run(0.0), run(3.0)
    assert b3["makespan_s"] == pytest.approx(b0["makespan_s"] + 4 * 3 * 0.08)  # 4 waves, 1 extend followed each
    ba = run(3.0, aligned=lambda t, x: 0.2)
    assert ba["ttft"][0] == pytest.approx(0.2)  # the queued rank's step at the all-rank price


def test_closed_loop_attention_dp_prices_lock_step_in_the_simulation_too():
    """predict_serve's closed loop and rank_arrays' steady state agree that an 8-rank attention-DP
    instance at 1k/1k concurrency 64 pays its neighbours' prefills: both well below the aligned
    price (every rank extending together), which the burst rows still use."""
    from cost_model.serving import predict_serve
    w = ServeWorkload(isl=1000, osl=1000, concurrency=64)
    p = predict_serve(DSV3, H200, ServePlan.parse("tp=8,attn_dp=8,ep=8"), w, precision="fp8", calibration=IDENTITY)
    ss = rank_arrays(DSV3, H200, [ServePlan.parse("tp=8,attn_dp=8,ep=8")], w, precision="fp8", calibration=IDENTITY)
    assert p.output_tokens_per_s_per_gpu == pytest.approx(float(ss["output_tokens_per_s_per_gpu"][0]), rel=0.05)
