"""Table queries of the cost model (`TableOps`): every hardware number the model uses comes
through here, from the lookup tables of `cost_model.tables`."""
from __future__ import annotations

import numpy as np

from cost_model.calibration import SPLIT_CLASSES
from cost_model.constants import ATTN_BWD_FLOPS_FACTOR, FLEX_PER_TOKEN_S, FLEX_REF_TOKEN_BYTES, FP8_QUANT_HBM_FRACTION
from specs.ranks import members_per_node, nodes_spanned

# dispatch_gap rows "stack@<class>": the part of the CPU stack's per-kernel gap a trial's split
# measures in <class> (trials/profile/stack_floor.py)
FLOOR_SPLIT_MODE = "stack@"


class TableOps:
    """Table queries of one evaluation: GEMM / grouped GEMM / attention seconds, collective and EP
    dispatch seconds, memory-bound rates, the CPU dispatch gap. Queries that depend only on the
    row key (`set_rowkey`) are interpolated once per distinct key."""

    def __init__(self, tables, cluster, fp8mask, fp8_gemm_time=None):
        """`fp8mask`: [P] plans whose GEMMs run fp8; `fp8_gemm_time`: [P] their fp8 GEMM time against
        the tables' per-tensor-scaled one (the recipe's scaling, `constants` FP8_GEMM_TIME_*;
        None: 1)."""
        self.t = tables
        self.c = cluster
        self.fp8 = fp8mask
        self.fp8_gemm_time = 1.0 if fp8_gemm_time is None else np.asarray(fp8_gemm_time, float)
        self._coll_min: dict[str, float] = {}  # collective -> smallest tabled message (`collective`)
        self.any_fp8 = bool(fp8mask.any()) and tables["gemm"].has("fp8")
        self.bw = {op: float(tables["membw"].lookup(op)) * 1e9 for op in
                   ("elementwise", "permute", "router", "cross_entropy", "optimizer")}
        # CPU devices execute ops on the dispatching thread: the floor adds to compute, and a
        # measured per-kernel gap of the trial stack itself (mode "stack", `moetune profile`) is
        # preferred over the bare-op chain ("eager") when the tables have it.
        self.async_launch = bool(getattr(cluster, "is_gpu", True))
        gaps = tables["dispatch_gap"]
        mode = "stack" if (not self.async_launch and gaps.has("stack")) else "eager"
        self.gap = float(gaps.lookup(mode)) * 1e-6
        # per layer and step (outside the microbatch loop: optimizer over the layer's tensors,
        # grad buffers) of the CPU trial stack, when measured; GPUs: in the optimizer bytes term
        self.step_gap = float(gaps.lookup("stack_step")) * 1e-6 if (mode == "stack" and gaps.has("stack_step")) else 0.0
        # where a trial's split measures that floor, {class: share} (empty: not measured; the model
        # then places it by the kernels each timed module issues)
        split = {}
        for (row,) in (gaps.row_keys() if mode == "stack" else ()):
            cls = row.removeprefix(FLOOR_SPLIT_MODE)
            if cls != row and cls in SPLIT_CLASSES:
                split[cls] = float(gaps.lookup(row))
        total = sum(split.values())
        self.floor_split = {c: v / total for c, v in sorted(split.items())} if total > 0 else {}
        self.up = max(1, int(cluster.scaleup_size))
        self.first = self.inv = None

    def set_rowkey(self, first, inv):
        """Plans sharing a row key (the plan columns that shape one layer) issue the same table
        queries: `_q` then interpolates only the distinct rows and scatters the result back."""
        self.first, self.inv = first, inv

    def _q(self, fn, *arrays):
        """fn(*arrays) evaluated once per distinct row key when every per-plan array is constant
        within each key (checked, O(n)); otherwise on all rows."""
        first, inv = self.first, self.inv
        if first is not None and len(first) < 0.5 * len(inv):
            n = len(inv)
            arrs = [np.asarray(a, float) for a in arrays]
            if all(a.ndim == 0 or (a.shape == (n,) and np.array_equal(a, a[first][inv])) for a in arrs):
                sub = fn(*[a if a.ndim == 0 else a[first] for a in arrs])
                return np.asarray(sub)[inv] if np.ndim(sub) else np.full(n, float(sub))
        return fn(*arrays)

    def _tf(self, fam, m, n, k, groups=None, bf16=False):
        tab = self.t[fam]
        if groups is None:
            look = lambda key: self._q(lambda m_, n_, k_: tab.lookup(key, m=m_, n=n_, k=k_), m, n, k)  # noqa: E731
        else:
            look = lambda key: self._q(lambda g_, m_, n_, k_: tab.lookup(key, groups=g_, m=m_, n=n_, k=k_),  # noqa: E731
                                       groups, m, n, k)
        bf = look("bf16")
        if bf16 or not self.any_fp8:
            return bf
        f8 = look("fp8") / self.fp8_gemm_time
        return np.where(self.fp8, f8, bf)

    def linear(self, m, n, k, bf16=False):
        """fwd, bwd, wgrad seconds of one linear layer y[m,n] = x[m,k] w[k,n]: bwd = dgrad + wgrad,
        and wgrad its weight-gradient part (the node megatron-core's delay_wgrad_compute runs
        apart); `bf16`: a layer that stays bf16 under an fp8 recipe (not a TransformerEngine module)."""
        m, n, k = (np.maximum(np.asarray(x, float), 1.0) for x in (m, n, k))
        fl = 2.0 * m * n * k
        f = fl / (self._tf("gemm", m, n, k, bf16=bf16) * 1e12)
        w = fl / (self._tf("gemm", k, n, m, bf16=bf16) * 1e12)
        b = fl / (self._tf("gemm", m, k, n, bf16=bf16) * 1e12) + w
        # fp8 operand casts are charged once, per recipe, in `blocks.fp8_quantize`
        return f, b, w

    def gemm(self, m, n, k, bf16=False):
        """fwd, bwd seconds of one linear layer (`linear` without the wgrad part)."""
        return self.linear(m, n, k, bf16)[:2]

    def grouped_linear(self, g, m, n, k, use_grouped):
        """fwd, bwd, wgrad seconds of `g` expert GEMMs of m rows each (bwd = dgrad + wgrad, as
        `linear`): one grouped GEMM where `use_grouped`, else g dense GEMMs one after another."""
        g, m, n, k = (np.maximum(np.asarray(x, float), 1.0) for x in (g, m, n, k))
        fl = 2.0 * g * m * n * k
        gf = fl / (self._tf("grouped_gemm", m, n, k, g) * 1e12)
        gw = fl / (self._tf("grouped_gemm", k, n, m, g) * 1e12)
        gb = fl / (self._tf("grouped_gemm", m, k, n, g) * 1e12) + gw
        # without grouped GEMM: one dense GEMM per local expert, sequentially
        sf, sb, sw = (t * g for t in self.linear(m, n, k))
        return np.where(use_grouped, gf, sf), np.where(use_grouped, gb, sb), np.where(use_grouped, gw, sw)

    def grouped(self, g, m, n, k, use_grouped):
        """fwd, bwd seconds of `g` expert GEMMs (`grouped_linear` without the wgrad part)."""
        return self.grouped_linear(g, m, n, k, use_grouped)[:2]

    @property
    def bw_fp8_quant(self) -> float:
        """Bytes/s training's fp8 quantisation kernels (TE cast + transpose per recipe,
        `blocks.fp8_quantize`) move: FP8_QUANT_HBM_FRACTION of the GPU's HBM (`constants`, a public
        kernel timing); CPU devices (no such kernels in their stack) keep the `membw` elementwise
        rate. Serving's plain per-GEMM input cast (`fp8_cast`, no transpose) is not that kernel."""
        hbm = float(getattr(self.c, "hbm_tbps", 0.0) or 0.0) * 1e12
        return FP8_QUANT_HBM_FRACTION * hbm if (self.async_launch and hbm > 0) else self.bw["elementwise"]

    def fp8_cast(self, elements):
        """Seconds of quantising `elements` bf16 activations to fp8 where the plan runs fp8 (read
        2 B, write 1 B, memory-bound): the serving step's per-GEMM input cast. Training charges
        its casts per recipe in `blocks.fp8_quantize` instead."""
        if not self.any_fp8:
            return 0.0
        return self.fp8 * 3.0 * np.asarray(elements, float) / self.bw["elementwise"]

    def attention(self, flops_f, seq, head_dim, bh):
        """fwd, bwd seconds of flash attention doing `flops_f` forward (causal) FLOPs in calls of
        `bh` = batch x heads each (the table's bh axis: on CPU the per-head cost grows with it)."""
        tab = self.t["attention"]

        def look(direction):
            return self._q(lambda s_, b_: tab.lookup(("bf16", direction), seq=s_, head_dim=head_dim, bh=b_), seq, bh)
        f = flops_f / (look("fwd") * 1e12)
        b = ATTN_BWD_FLOPS_FACTOR * flops_f / (look("bwd") * 1e12)
        return f, b

    def scope(self, size, stride):
        """(crosses scale-up domain?, members per domain) for a group of `size` with `stride`."""
        size = np.asarray(size)
        stride = np.asarray(stride)
        return nodes_spanned(size, stride, self.up) > 1, members_per_node(size, stride, self.up)

    def collective(self, coll, nbytes, size, stride):
        """Seconds of one collective whose full (gathered / reduced) buffer is `nbytes`."""
        size = np.asarray(size, float)
        nbytes = np.asarray(nbytes, float)
        out, per = self.scope(size, stride)
        tab = self.t["collectives"]
        g = np.maximum(size, 2)
        nb = np.maximum(nbytes, 1)
        bw_up = self._q(lambda g_, b_: tab.lookup((coll, "scaleup"), group=g_, per_node=g_, bytes=b_), g, nb)
        bw_out = self._q(lambda g_, p_, b_: tab.lookup((coll, "scaleout"), group=g_, per_node=p_, bytes=b_),
                         g, np.maximum(per, 1), nb)
        bw = np.where(out, bw_out, bw_up) * 1e9
        # below the smallest message the table holds, a collective costs what that message costs (its
        # latency): the bandwidth clamped at the table's edge alone would shrink the time with the
        # bytes, to ~0.5 us for an 8-byte all-reduce across nodes; an empty one costs nothing
        nbytes = np.where(nbytes > 0, np.maximum(nbytes, self._collective_min_bytes(coll)), 0.0)
        if coll == "all_reduce":
            vol = 2.0 * nbytes * (size - 1) / np.maximum(size, 1)
        elif coll in ("reduce_scatter", "all_gather"):
            vol = nbytes * (size - 1) / np.maximum(size, 1)
        else:
            vol = nbytes
        return np.where(size > 1, vol / bw, 0.0)

    def _collective_min_bytes(self, coll) -> float:
        """The smallest message size the collectives table holds for `coll` (either fabric)."""
        if coll not in self._coll_min:
            tab = self.t["collectives"]
            sizes = [tab.axis_min(k, "bytes") for k in tab.row_keys() if k[0] == coll]
            self._coll_min[coll] = min(sizes) if sizes else 0.0
        return self._coll_min[coll]

    def ep_dispatch(self, backend_code, nbytes_d, nbytes_c, ep, etp, inter=None, intra=None, token_bytes=None):
        """fwd seconds of (dispatch, combine) for per-GPU payloads (all copies). `inter`: the share of
        the payload charged on the scale-out fabric (default: uniform, (ep - per)/ep); `intra`: the
        share charged on the scale-up fabric (default (per - 1)/ep). Slower fabric sets the time.
        `token_bytes` = (dispatch, combine) bytes per token: the DeepEP / HybridEP rows then get the
        per-token cost of tokens smaller than the rows' own (`constants` FLEX_PER_TOKEN_S)."""
        ep = np.asarray(ep, float)
        out, per = self.scope(ep, etp)
        per = np.minimum(per, ep)
        if intra is None:
            intra = (per - 1) / ep
        if inter is None:
            inter = (ep - per) / ep
        tab = self.t["ep_dispatch"]
        names = ("alltoall", "alltoall", "deepep", "hybridep")
        res_d = np.zeros_like(ep)
        res_c = np.zeros_like(ep)
        for code in np.unique(backend_code):
            sel = backend_code == code
            name = names[int(code)]
            if not tab.has(name, "scaleup"):
                name = "alltoall"

            def lk(scope, v, name=name):
                return self._q(lambda e_: tab.lookup((name, scope), v, ep=e_), ep)
            du = lk("scaleup", "dispatch_gbps") * 1e9
            cu = lk("scaleup", "combine_gbps") * 1e9
            do = lk("scaleout", "dispatch_gbps") * 1e9
            co = lk("scaleout", "combine_gbps") * 1e9
            lat = np.where(out, lk("scaleout", "latency_us"), lk("scaleup", "latency_us")) * 1e-6
            up_d, up_c = nbytes_d * intra / du, nbytes_c * intra / cu
            out_d, out_c = nbytes_d * inter / do, nbytes_c * inter / co
            if token_bytes is not None and (name, "scaleup") in FLEX_PER_TOKEN_S:
                # t = tokens x c0 + bytes / peak, the table rate holding at the rows' token size
                sd, sc = (np.maximum(np.asarray(b, float), 1.0) for b in token_bytes)
                fd, fc = 1.0 - sd / FLEX_REF_TOKEN_BYTES[0], 1.0 - sc / FLEX_REF_TOKEN_BYTES[1]
                (ud, uc), (od, oc) = FLEX_PER_TOKEN_S[(name, "scaleup")], FLEX_PER_TOKEN_S[(name, "scaleout")]
                up_d = up_d + nbytes_d * intra / sd * ud * fd
                up_c = up_c + nbytes_c * intra / sc * uc * fc
                out_d = out_d + nbytes_d * inter / sd * od * fd
                out_c = out_c + nbytes_c * inter / sc * oc * fc
            td = np.maximum(up_d, out_d) + lat
            tc = np.maximum(up_c, out_c) + lat
            res_d = np.where(sel, td, res_d)
            res_c = np.where(sel, tc, res_c)
        return np.where(ep > 1, res_d, 0.0), np.where(ep > 1, res_c, 0.0)

    def router_gemm_bf16_tflops(self, m, n, k):
        """Achieved bf16 TFLOPS of the router GEMM [m, k] x [k, n] (only m varies per plan)."""
        tab = self.t["gemm"]
        return self._q(lambda m_: tab.lookup("bf16", m=m_, n=n, k=k), m)
