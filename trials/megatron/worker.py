"""One rank of a Megatron-core trial: `python -m trials.megatron.worker SPEC.json`.

Launched `world` times by `trials.megatron.backend` with RANK / WORLD_SIZE / LOCAL_RANK /
MASTER_ADDR / MASTER_PORT set (torchrun-equivalent). Each rank writes `rank<N>.json` into the
spec's out_dir: either a result ({"ok": true, step times, losses, peak memory}) or an error
({"ok": false, "kind": stack-rejected|unrealizable|oom|crash, "message", "phase", "time"}).

`TrialWorker` (torchtitan-style): `setup()` gloo (CPU) or NCCL (GPU) process group ->
initialize_model_parallel -> TransformerConfig -> GPTModel chunks (one per virtual stage, with
the layer spec the launcher chose: TE or local, see spec_choice) -> megatron DDP -> optimizer;
`step()` one `get_forward_backward_func()` schedule over num_microbatches = gbs / (mbs * dp)
plus the optimizer step; `measure()` the timed loop.

Optimizer: on GPU Megatron's own (`get_megatron_optimizer`, DistributedOptimizer when
plan.dist_opt) with the emitted script's weight decay 0.1 and clip-grad 1.0; on CPU torch Adam
over `param.main_grad` (Megatron's optimizers hard-code CUDA buffers). Mode "grads" runs one
fwd/bwd without an optimizer step and dumps the full gradients keyed by global parameter name.

Timing: barrier, then perf_counter around schedule + optimizer step + `cuda.synchronize`; the
synthetic batches are generated and copied to the device *before* the timed loop.
Memory (per rank): on CPU the process's peak RSS; on GPU the caching allocator's peak reserved
bytes since the start of the timed region (`reset_peak_memory_stats` after warm-up) plus what
the device holds outside the allocator (CUDA context, NCCL buffers, library workspaces:
device used bytes from `mem_get_info` minus `memory_reserved`, measured after the timed loop;
assumes one process per device). A GPU memory cap bounds the allocator
(`set_per_process_memory_fraction`); exceeding it raises CUDA OOM, reported as "oom".

Failure classes: "stack-rejected" only for megatron-core's own validation (AssertionError /
ValueError / NotImplementedError raised from megatron code during setup); "unrealizable" for
a batch the plan cannot split; "oom"; everything else (missing libraries, our own bugs,
errors while training) "crash" with the message.
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback

import torch

from specs.fileio import write_atomic

# megatron-core's own configuration checks raise these (TransformerConfig.__post_init__,
# parallel_state, model constructors); other types from megatron are bugs or missing pieces.
VALIDATION_ERRORS = (AssertionError, ValueError, NotImplementedError)
# recorded with each measurement (set by the launcher on GPU from specs.stack.launch_env)
LAUNCH_ENV_KEYS = ("CUDA_DEVICE_MAX_CONNECTIONS", "TORCH_NCCL_AVOID_RECORD_STREAMS", "NCCL_NVLS_ENABLE",
                   "GLIBC_TUNABLES")


class Unrealizable(Exception):
    """The plan cannot be run on this workload (e.g. the global batch does not split)."""


def _megatron_frame(exc: BaseException) -> bool:
    """True when the innermost frame of `exc`'s traceback is megatron-core source."""
    tb = exc.__traceback__
    last = None
    while tb is not None:
        last = tb
        tb = tb.tb_next
    if last is None:
        return False
    path = os.path.normpath(last.tb_frame.f_code.co_filename)
    return f"{os.sep}megatron{os.sep}core{os.sep}" in path


def classify_error(exc: BaseException, phase: str) -> tuple[str, str]:
    """(failure kind, message) for an exception raised in `phase` ("init", "setup", "train")."""
    msg = f"{type(exc).__name__}: {exc}"
    if isinstance(exc, Unrealizable):
        return "unrealizable", str(exc)
    oom_types = (MemoryError,) + ((torch.cuda.OutOfMemoryError,) if hasattr(torch.cuda, "OutOfMemoryError") else ())
    if isinstance(exc, oom_types) or "out of memory" in str(exc).lower():
        return "oom", msg
    if phase == "setup" and isinstance(exc, VALIDATION_ERRORS) and _megatron_frame(exc):
        return "stack-rejected", msg
    return "crash", msg


def _pin(rank: int) -> None:
    """CPU trials only: one core per rank, one intra-op thread (2-core machines, several ranks).
    Never on GPU, where the main, autograd and NCCL threads need cores of their own."""
    torch.set_num_threads(1)
    try:
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cores[rank % len(cores)]})
    except (AttributeError, OSError):
        pass


def synthetic_batch(iteration: int, gbs: int, seq: int, vocab: int, seed: int) -> torch.Tensor:
    """gbs sequences of seq+1 tokens, identical for every plan: each sequence follows a fixed
    affine recurrence t' = (5 t + 3) mod V from a random start, so a model can learn it."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + iteration)
    start = torch.randint(0, vocab, (gbs, 1), generator=g)
    toks = start.clone().repeat(1, seq + 1)
    for i in range(1, seq + 1):
        toks[:, i] = (5 * toks[:, i - 1] + 3) % vocab
    # a little noise so the task is not trivially periodic
    noise = torch.rand((gbs, seq + 1), generator=g) < 0.1
    toks = torch.where(noise, torch.randint(0, vocab, (gbs, seq + 1), generator=g), toks)
    return toks


def _microbatches(tokens, mbs, dp_rank, num_mb, device):
    """This DP rank's microbatches: global sequences [dp_rank*num_mb*mbs, ...)."""
    seq = tokens.shape[1] - 1
    pos = torch.arange(seq, device=device).unsqueeze(0)
    out = []
    for i in range(num_mb):
        lo = (dp_rank * num_mb + i) * mbs
        chunk = tokens[lo:lo + mbs].to(device)
        out.append({"tokens": chunk[:, :-1].contiguous(), "labels": chunk[:, 1:].contiguous(),
                    "position_ids": pos.expand(mbs, -1)})
    return out


def _loss_func(output_tensor):
    loss = output_tensor.float().mean()
    return loss, {"lm loss": loss.detach().clone()}  # clone: the schedule divides loss in place


def _forward_step(data_iterator, model, return_schedule_plan: bool = False):
    """Megatron's forward_step_func. The schedules call it as (data_iterator, model); the
    combined 1F1B schedule of EP all-to-all overlap (combined_1f1b.py) calls it with
    return_schedule_plan=True on the unwrapped GPTModel and expects (schedule plan, loss_func),
    as Megatron-LM's pretrain_gpt.forward_step returns."""
    batch = next(data_iterator)
    if return_schedule_plan:
        plan = model.build_schedule_plan(batch["tokens"], batch["position_ids"], None, labels=batch["labels"])
        return plan, _loss_func
    out = model(batch["tokens"], batch["position_ids"], None, labels=batch["labels"])
    return out, _loss_func


class TrialWorker:
    """One rank: `setup()`, then `step(batches)` per iteration, `measure()` for the timed run."""

    def __init__(self, spec: dict, rank: int, world: int):
        self.spec, self.rank, self.world = spec, rank, world
        self.local_rank = int(os.environ.get("LOCAL_RANK", rank))
        self.on_gpu = torch.cuda.is_available()
        self.phase = "init"
        self.patched = False
        self.mopt = self.opt = None

    # ---- setup ----------------------------------------------------------------------------------
    def setup(self) -> None:
        spec = self.spec
        if not self.on_gpu:
            _pin(self.rank)
        else:
            # the rank's device first, so no import below creates a context on device 0
            torch.cuda.set_device(self.local_rank)
            torch.cuda.init()
            cap = spec.get("memory_cap_gib")
            if cap:
                total = torch.cuda.mem_get_info()[1]
                torch.cuda.set_per_process_memory_fraction(min(1.0, float(cap) * 2**30 / total))
        from trials.megatron import cpu_compat
        self.patched = cpu_compat.apply()
        import torch.distributed as dist
        self.dist = dist
        from trials.rendezvous import init_process_group  # rank 0's store listens on MASTER_ADDR only
        init_process_group("nccl" if self.on_gpu else "gloo", self.rank, self.world,
                           float(spec.get("pg_timeout_s", 600)))
        self.device = torch.device("cuda", torch.cuda.current_device()) if self.on_gpu else torch.device("cpu")

        from specs.model_spec import from_dict
        from specs.plan import Plan
        self.plan = Plan.parse(spec["plan"])
        self.model_spec = from_dict(spec["model"])
        self.gbs, self.seq = int(spec["gbs"]), int(spec["seq"])
        if "use_te" in spec:  # chosen by the backend (MegatronBackend.run)
            self.use_te = bool(spec["use_te"])
        else:  # direct `launch` callers: the same choice, made here
            from specs.stack import detect_installed
            from trials.megatron.spec_choice import layer_spec_choice
            self.use_te = layer_spec_choice(self.plan, detect_installed(), self.model_spec).use_te
        self.phase = "setup"
        self._build()

    def _build(self) -> None:
        from megatron.core import parallel_state as ps
        from megatron.core import tensor_parallel

        from trials.megatron.model import build_chunks, deterministic_init, transformer_config

        plan, spec = self.plan, self.spec
        ps.initialize_model_parallel(
            tensor_model_parallel_size=plan.tp,
            pipeline_model_parallel_size=plan.pp,
            virtual_pipeline_model_parallel_size=plan.vpp if plan.vpp > 1 else None,
            context_parallel_size=plan.cp,
            expert_model_parallel_size=plan.ep,
            expert_tensor_parallel_size=plan.etp,
        )
        tensor_parallel.model_parallel_cuda_manual_seed(int(spec.get("seed", 1234)))
        config = transformer_config(self.model_spec, plan, on_gpu=self.on_gpu, seq=self.seq,
                                    overrides=spec.get("config_overrides"), use_te=self.use_te)
        self.dp = ps.get_data_parallel_world_size()
        if self.gbs % (plan.mbs * self.dp):
            raise Unrealizable(f"global batch {self.gbs} is not divisible by mbs*dp = {plan.mbs}*{self.dp}")
        self.num_mb = self.gbs // (plan.mbs * self.dp)
        chunks = build_chunks(self.model_spec, config, on_gpu=self.on_gpu, use_te=self.use_te)
        deterministic_init(chunks, seed=int(spec.get("seed", 1234)))
        from megatron.core.distributed import (
            DistributedDataParallel,
            DistributedDataParallelConfig,
            finalize_model_grads,
        )
        ddp_cfg = DistributedDataParallelConfig(
            grad_reduce_in_fp32=not plan.grad_reduce_bf16,
            overlap_grad_reduce=plan.overlap_grad_reduce,
            overlap_param_gather=plan.overlap_param_gather,
            use_distributed_optimizer=plan.dist_opt,
        )
        chunks = [DistributedDataParallel(config=config, ddp_config=ddp_cfg, module=c,
                                          disable_bucketing=(i > 0))
                  for i, c in enumerate(chunks)]
        config.finalize_model_grads_func = finalize_model_grads
        if len(chunks) > 1 or plan.overlap_grad_reduce:
            config.no_sync_func = [c.no_sync for c in chunks]
            if len(chunks) == 1:
                config.no_sync_func = config.no_sync_func[0]
        if plan.overlap_grad_reduce:
            config.grad_sync_func = [c.start_grad_sync for c in chunks]
            if len(chunks) == 1:
                config.grad_sync_func = config.grad_sync_func[0]
        self.config, self.chunks = config, chunks
        self.params = [p for c in chunks for p in c.parameters() if p.requires_grad]
        lr = float(spec.get("lr", 3e-3))
        if self.on_gpu:
            # Megatron's own optimizer, as the emitted script configures it (--weight-decay 0.1
            # --clip-grad 1.0); DistributedOptimizer when plan.dist_opt.
            from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
            self.mopt = get_megatron_optimizer(
                OptimizerConfig(optimizer="adam", lr=lr, weight_decay=0.1, bf16=config.bf16,
                                use_distributed_optimizer=plan.dist_opt, clip_grad=1.0),
                chunks)
        else:
            # CPU: torch Adam over the DDP-reduced param.main_grad (dist_opt is refused on CPU).
            self.opt = torch.optim.Adam(self.params, lr=lr)
        from megatron.core.pipeline_parallel import get_forward_backward_func
        self.fwd_bwd = get_forward_backward_func()
        self.dp_rank = ps.get_data_parallel_rank()
        self.is_last = ps.is_pipeline_last_stage(ignore_virtual=True)

    # ---- one step --------------------------------------------------------------------------------
    def batches(self, it: int) -> list:
        """Iteration `it`'s microbatches for this DP rank, already on the device."""
        tokens = synthetic_batch(it, self.gbs, self.seq, self.model_spec.vocab_size,
                                 int(self.spec.get("data_seed", 7)))
        return _microbatches(tokens, self.plan.mbs, self.dp_rank, self.num_mb, self.device)

    def forward_backward(self, mbs_list) -> float | None:
        chunks = self.chunks
        iters = [iter(mbs_list) for _ in chunks] if len(chunks) > 1 else iter(mbs_list)
        for c in chunks:
            c.zero_grad_buffer()
        losses = self.fwd_bwd(forward_step_func=_forward_step, data_iterator=iters,
                              model=chunks if len(chunks) > 1 else chunks[0],
                              num_microbatches=self.num_mb, seq_length=self.seq,
                              micro_batch_size=self.plan.mbs, forward_only=False)
        if self.is_last and losses:
            return float(sum(float(d["lm loss"]) for d in losses) / len(losses))
        return None

    def step(self, mbs_list) -> float | None:
        loss = self.forward_backward(mbs_list)
        if self.mopt is not None:
            self.mopt.step()
            self.mopt.zero_grad()
        else:
            for p in self.params:
                p.grad = p.main_grad.to(p.dtype) if p.main_grad.dtype != p.dtype else p.main_grad
            self.opt.step()
        return loss

    def _trace_step(self, batch, trace_dir: str) -> None:
        """Run one more step under torch.profiler and write, per rank, the ops by self CPU time
        (trace_rank<r>.txt) and a Chrome trace (trace_rank<r>.json) into `trace_dir`."""
        from torch.profiler import ProfilerActivity, profile
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if self.on_gpu else [])
        self.dist.barrier()
        with profile(activities=acts, record_shapes=True) as prof:
            self.step(batch)
            if self.on_gpu:
                torch.cuda.synchronize()
        os.makedirs(trace_dir, exist_ok=True)
        sort = "self_cuda_time_total" if self.on_gpu else "self_cpu_time_total"
        with open(os.path.join(trace_dir, f"trace_rank{self.rank}.txt"), "w") as f:
            f.write(prof.key_averages().table(sort_by=sort, row_limit=60))
            # the same ops by input shape: which tensors the time goes to
            f.write(prof.key_averages(group_by_input_shape=True).table(sort_by=sort, row_limit=80))
        prof.export_chrome_trace(os.path.join(trace_dir, f"trace_rank{self.rank}.json"))
        self.dist.barrier()

    def _component_step(self, batch, step_s: float) -> dict:
        """One more, untimed step under torch.profiler: this rank's share of the step per
        calibration class (trials/megatron/components.py); `step_s` is the timed steps' median."""
        from torch.profiler import ProfilerActivity, profile

        from trials.megatron.components import combine_shares, labelled, split_events, timed_modules
        self.dist.barrier()
        with timed_modules(self.chunks, {}) as timed:  # the module-held classes, without the profiler
            t0 = time.perf_counter()
            self.step(batch)
            timed_step_s = time.perf_counter() - t0
        self.dist.barrier()
        with labelled(self.chunks), profile(activities=[ProfilerActivity.CPU], record_shapes=False) as prof:
            t0 = time.perf_counter()
            self.step(batch)
            wall_us = (time.perf_counter() - t0) * 1e6
        trace_dir = os.environ.get("MOETUNE_TRIAL_TRACE")
        by_op: dict | None = {} if trace_dir else None
        scoped: dict = {}
        profiled = split_events(prof.events(), wall_us, step_s * 1e6, by_op, scoped)
        shares = combine_shares(profiled, scoped, timed, timed_step_s)
        if trace_dir:  # the split op by op, largest first: which ops make each class
            os.makedirs(trace_dir, exist_ok=True)
            with open(os.path.join(trace_dir, f"split_rank{self.rank}.txt"), "w") as f:
                f.write(f"# profiled wall {wall_us:.0f} us, timed step {step_s * 1e6:.0f} us; hooked step "
                        f"{timed_step_s * 1e6:.0f} us: " + ", ".join(f"{c} {t * 1e6:.0f} us" for c, t in timed.items())
                        + "\n# shares: " + ", ".join(f"{c} {v:.3f}" for c, v in sorted(shares.items())) + "\n")
                f.write("".join(f"{c:16s} {us:12.0f} us {n:6d} calls  {name}\n"
                                for (c, name), (us, n) in sorted(by_op.items(), key=lambda kv: -kv[1][0])))
        self.dist.barrier()
        return shares

    # ---- modes -----------------------------------------------------------------------------------
    def dump_grads(self) -> dict:
        from trials.megatron.model import global_param_names
        self.forward_backward(self.batches(0))
        dump = {}
        for c in self.chunks:
            names = global_param_names(c.module)
            for local, p in c.module.named_parameters():
                g = getattr(p, "main_grad", None)
                dump[names[local]] = {"grad": None if g is None else g.detach().float().cpu().clone(),
                                      "param": p.detach().float().cpu().clone()}
        torch.save(dump, os.path.join(self.spec["out_dir"], f"grads_rank{self.rank}.pt"))
        self.dist.barrier()
        return {"ok": True, "rank": self.rank, "mode": "grads"}

    def measure(self) -> dict:
        dist = self.dist
        iters_n, warm = int(self.spec.get("iters", 5)), int(self.spec.get("warmup", 2))
        # Every iteration's batches are generated and copied to the device before timing.
        batches = [self.batches(it) for it in range(warm + iters_n)]
        if self.on_gpu:
            torch.cuda.synchronize()
        times, losses = [], []
        for it in range(warm + iters_n):
            if it == warm and self.on_gpu:
                torch.cuda.reset_peak_memory_stats()  # peak of the timed (steady-state) steps
            dist.barrier()
            t0 = time.perf_counter()
            loss = self.step(batches[it])
            if self.on_gpu:
                torch.cuda.synchronize()
            dist.barrier()
            dt = time.perf_counter() - t0
            if it >= warm:
                times.append(dt)
            losses.append(loss)
        memory = self.peak_memory()
        trace_dir = os.environ.get("MOETUNE_TRIAL_TRACE")
        if trace_dir:  # one extra, untimed step under torch.profiler: where a step's time goes
            self._trace_step(batches[-1], trace_dir)
        # on CPU, one more untimed profiled step splits the step by calibration class (the
        # per-component calibration fits it); MOETUNE_TRIAL_COMPONENTS=0 skips it
        shares = (self._component_step(batches[-1], sorted(times)[len(times) // 2])
                  if not self.on_gpu and os.environ.get("MOETUNE_TRIAL_COMPONENTS", "1") != "0" else None)
        # losses live on the last pipeline stage: gather them to every rank.
        obj = [None] * self.world
        dist.all_gather_object(obj, {"rank": self.rank, "losses": losses, "is_last": self.is_last,
                                     "memory": memory, "shares": shares})
        # each last-stage rank holds the mean over its own DP shard: average over those ranks
        # (TP/CP/EP replicas of one shard hold the same value, so the mean is the global mean).
        last = [o["losses"] for o in obj if o["is_last"] and o["losses"] and o["losses"][0] is not None]
        mean_losses = [sum(ls[i] for ls in last) / len(last) for i in range(len(last[0]))]
        dist.barrier()
        return {"ok": True, "rank": self.rank, "step_times_s": times, "losses": mean_losses,
                "peak_memory_gib": [o["memory"]["peak_gib"] for o in obj],
                "memory_detail": [o["memory"] for o in obj], "dp": self.dp,
                "component_shares": [o["shares"] for o in obj if o["shares"]],
                "num_microbatches": self.num_mb, "versions": self.versions(), "cpu_patched": self.patched}

    def peak_memory(self) -> dict:
        """This rank's peak memory (see the module docstring for what is included)."""
        if not self.on_gpu:
            import resource
            return {"peak_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,  # KiB
                    "what": "host peak RSS"}
        torch.cuda.synchronize()
        free, total = torch.cuda.mem_get_info()
        reserved = torch.cuda.memory_reserved()
        outside = max(0, (total - free) - reserved)
        peak_reserved = torch.cuda.max_memory_reserved()
        return {"peak_gib": (peak_reserved + outside) / 2**30,
                "peak_reserved_gib": peak_reserved / 2**30,
                "peak_allocated_gib": torch.cuda.max_memory_allocated() / 2**30,
                "outside_allocator_gib": outside / 2**30,
                "device_total_gib": total / 2**30,
                "what": "peak reserved (timed steps) + device memory outside the allocator"}

    def versions(self) -> dict:
        import megatron.core
        v = {"torch": torch.__version__, "megatron-core": megatron.core.__version__,
             "device": torch.cuda.get_device_name() if self.on_gpu else "cpu",
             "transformer_impl": "transformer_engine" if self.use_te else "local",
             "env": {k: os.environ[k] for k in LAUNCH_ENV_KEYS if k in os.environ}}
        try:
            v["cpu_affinity"] = len(os.sched_getaffinity(0))  # 1 on CPU (pinned), all cores on GPU
        except AttributeError:
            pass
        if self.on_gpu:
            v["cuda"] = torch.version.cuda
            nccl = torch.cuda.nccl.version()  # a tuple in torch 2.x, an int in older releases
            v["nccl"] = ".".join(str(x) for x in nccl) if isinstance(nccl, tuple) else str(nccl)
        if self.use_te:
            import transformer_engine
            v["transformer_engine"] = getattr(transformer_engine, "__version__", "")
        return v


def main(spec_path: str) -> int:
    with open(spec_path) as f:
        spec = json.load(f)
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    out = os.path.join(spec["out_dir"], f"rank{rank}.json")
    w = TrialWorker(spec, rank, world)
    try:
        w.setup()
        w.phase = "train"
        result = w.dump_grads() if spec.get("mode") == "grads" else w.measure()
        write_atomic(out, json.dumps(result))
        return 0
    except BaseException as e:  # noqa: BLE001 - every failure is reported, then the rank exits
        kind, msg = classify_error(e, w.phase)
        write_atomic(out, json.dumps({"ok": False, "rank": rank, "kind": kind, "message": msg[:4000],
                                      "phase": w.phase, "time": time.time(),
                                      "traceback": traceback.format_exc()[-6000:]}))
        sys.stderr.write(traceback.format_exc())
        sys.stderr.flush()
        os._exit(1)  # peers may be blocked in a collective; the launcher kills the group


if __name__ == "__main__":
    rc = main(sys.argv[1])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)  # skip interpreter teardown (gloo/threads) once the result is written
