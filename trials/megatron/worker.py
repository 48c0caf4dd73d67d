"""One rank of a Megatron-core trial: `python -m trials.megatron.worker SPEC.json`.

Launched `world` times by `trials.megatron.backend` with RANK / WORLD_SIZE / LOCAL_RANK /
MASTER_ADDR / MASTER_PORT set (torchrun-equivalent). Each rank writes `rank<N>.json` into the
spec's out_dir: either a result ({"ok": true, step times, losses, peak memory}) or an error
({"ok": false, "kind": stack-rejected|oom|crash, "message", "phase", "time"}).

Steps: gloo (CPU) or NCCL (GPU) process group -> initialize_model_parallel -> TransformerConfig
-> GPTModel chunks (one per virtual stage) -> megatron DDP -> `get_forward_backward_func()`
schedule over num_microbatches = gbs / (mbs * dp) -> finalize_model_grads -> optimizer step.
CPU optimizer: torch Adam over `param.main_grad` (Megatron's optimizers/DistributedOptimizer
hard-code CUDA buffers). Mode "grads" runs one fwd/bwd without an optimizer step and dumps the
full gradients keyed by global parameter name (for the gradient-equality tests).
"""
from __future__ import annotations

import json
import os
import sys
import time
import traceback
from datetime import timedelta

import torch


class StackRejected(Exception):
    """Megatron-core refused the configuration (validation in its own code)."""


def _pin(rank: int) -> None:
    torch.set_num_threads(1)
    try:
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cores[rank % len(cores)]})
    except (AttributeError, OSError):
        pass


def _peak_mem_gib(on_gpu: bool) -> float:
    if on_gpu:
        return torch.cuda.max_memory_allocated() / 2**30
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


def synthetic_batch(iteration: int, gbs: int, seq: int, vocab: int, seed: int) -> torch.Tensor:
    """gbs sequences of seq+1 tokens, identical for every plan: each sequence follows a fixed
    affine recurrence t' = (5 t + 3) mod V from a random start, so a model can learn it."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + iteration)
    start = torch.randint(0, vocab, (gbs, 1), generator=g)
    steps = torch.arange(seq + 1).unsqueeze(0)
    toks = start.clone().repeat(1, seq + 1)
    for i in range(1, seq + 1):
        toks[:, i] = (5 * toks[:, i - 1] + 3) % vocab
    # a little noise so the task is not trivially periodic
    noise = torch.rand((gbs, seq + 1), generator=g) < 0.1
    toks = torch.where(noise, torch.randint(0, vocab, (gbs, seq + 1), generator=g), toks)
    del steps
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


def _forward_step(data_iterator, model):
    batch = next(data_iterator)
    out = model(batch["tokens"], batch["position_ids"], None, labels=batch["labels"])
    return out, _loss_func


def main(spec_path: str) -> int:
    spec = json.load(open(spec_path))
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    out_dir = spec["out_dir"]
    phase = "init"

    def write(obj):
        tmp = os.path.join(out_dir, f".rank{rank}.json.tmp")
        with open(tmp, "w") as f:
            json.dump(obj, f)
        os.replace(tmp, os.path.join(out_dir, f"rank{rank}.json"))

    try:
        _pin(rank)
        from trials.megatron import cpu_compat
        patched = cpu_compat.apply()
        on_gpu = not patched
        if on_gpu:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
        import torch.distributed as dist
        dist.init_process_group("nccl" if on_gpu else "gloo", rank=rank, world_size=world,
                                timeout=timedelta(seconds=float(spec.get("pg_timeout_s", 600))))
        device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")

        from megatron.core import parallel_state as ps
        from megatron.core import tensor_parallel

        from specs.model_spec import from_dict
        from specs.plan import Plan
        from trials.megatron.model import build_chunks, deterministic_init, global_param_names, transformer_config

        plan = Plan.parse(spec["plan"])
        model = from_dict(spec["model"])
        gbs, seq = int(spec["gbs"]), int(spec["seq"])

        phase = "setup"
        try:
            ps.initialize_model_parallel(
                tensor_model_parallel_size=plan.tp,
                pipeline_model_parallel_size=plan.pp,
                virtual_pipeline_model_parallel_size=plan.vpp if plan.vpp > 1 else None,
                context_parallel_size=plan.cp,
                expert_model_parallel_size=plan.ep,
                expert_tensor_parallel_size=plan.etp,
            )
            tensor_parallel.model_parallel_cuda_manual_seed(int(spec.get("seed", 1234)))
            config = transformer_config(model, plan, on_gpu=on_gpu, seq=seq,
                                        overrides=spec.get("config_overrides"))
            dp = ps.get_data_parallel_world_size()
            if gbs % (plan.mbs * dp):
                raise StackRejected(f"global batch {gbs} is not divisible by mbs*dp = {plan.mbs}*{dp}")
            num_mb = gbs // (plan.mbs * dp)
            chunks = build_chunks(model, config, on_gpu=on_gpu)
            deterministic_init(chunks, seed=int(spec.get("seed", 1234)))
            from megatron.core.distributed import (
                DistributedDataParallel,
                DistributedDataParallelConfig,
                finalize_model_grads,
            )
            from megatron.core.pipeline_parallel import get_forward_backward_func
            ddp_cfg = DistributedDataParallelConfig(
                grad_reduce_in_fp32=True,
                overlap_grad_reduce=plan.overlap_grad_reduce,
                overlap_param_gather=plan.overlap_param_gather,
                use_distributed_optimizer=plan.dist_opt,
            )
            chunks = [DistributedDataParallel(config=config, ddp_config=ddp_cfg, module=c,
                                              disable_bucketing=(i > 0))
                      for i, c in enumerate(chunks)]
        except (AssertionError, ValueError, NotImplementedError, TypeError, ImportError, StackRejected) as e:
            raise StackRejected(f"{type(e).__name__}: {e}") from e

        config.finalize_model_grads_func = finalize_model_grads
        if len(chunks) > 1 or plan.overlap_grad_reduce:
            config.no_sync_func = [c.no_sync for c in chunks]
            if len(chunks) == 1:
                config.no_sync_func = config.no_sync_func[0]
        if plan.overlap_grad_reduce:
            config.grad_sync_func = [c.start_grad_sync for c in chunks]
            if len(chunks) == 1:
                config.grad_sync_func = config.grad_sync_func[0]
        params = [p for c in chunks for p in c.parameters() if p.requires_grad]
        lr = float(spec.get("lr", 3e-3))
        if on_gpu:
            # GPU: Megatron's own optimizer (DistributedOptimizer when plan.dist_opt).
            # NOTE: not exercised in this repository's CI (no GPU); the CPU path below is tested.
            from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
            mopt = get_megatron_optimizer(
                OptimizerConfig(optimizer="adam", lr=lr, bf16=config.bf16,
                                use_distributed_optimizer=plan.dist_opt, clip_grad=0.0),
                chunks)
        else:
            # CPU: Megatron's optimizers/DistributedOptimizer hard-code CUDA buffers; use torch
            # Adam over the DDP-reduced param.main_grad (dist_opt is refused on CPU).
            mopt = None
            opt = torch.optim.Adam(params, lr=lr)
        fwd_bwd = get_forward_backward_func()
        dp_rank = ps.get_data_parallel_rank()
        vocab = model.vocab_size
        data_seed = int(spec.get("data_seed", 7))
        is_last = ps.is_pipeline_last_stage(ignore_virtual=True)

        def step(it):
            tokens = synthetic_batch(it, gbs, seq, vocab, data_seed)
            mbs_list = _microbatches(tokens, plan.mbs, dp_rank, num_mb, device)
            iters = [iter(mbs_list) for _ in chunks] if len(chunks) > 1 else iter(mbs_list)
            for c in chunks:
                c.zero_grad_buffer()
            losses = fwd_bwd(forward_step_func=_forward_step, data_iterator=iters,
                             model=chunks if len(chunks) > 1 else chunks[0],
                             num_microbatches=num_mb, seq_length=seq, micro_batch_size=plan.mbs,
                             forward_only=False)
            loss = None
            if is_last and losses:
                loss = float(sum(float(d["lm loss"]) for d in losses) / len(losses))
            return loss

        phase = "train"
        if spec.get("mode") == "grads":
            step(0)
            dump = {}
            for c in chunks:
                names = global_param_names(c.module)
                for local, p in c.module.named_parameters():
                    g = getattr(p, "main_grad", None)
                    dump[names[local]] = {"grad": None if g is None else g.detach().float().cpu().clone(),
                                          "param": p.detach().float().cpu().clone()}
            torch.save(dump, os.path.join(out_dir, f"grads_rank{rank}.pt"))
            write({"ok": True, "rank": rank, "mode": "grads"})
            dist.barrier()
            return 0

        iters_n, warm = int(spec.get("iters", 5)), int(spec.get("warmup", 2))
        times, losses = [], []
        for it in range(warm + iters_n):
            dist.barrier()
            t0 = time.perf_counter()
            loss = step(it)
            if mopt is not None:
                mopt.step()
                mopt.zero_grad()
            else:
                for p in params:
                    p.grad = p.main_grad.to(p.dtype) if p.main_grad.dtype != p.dtype else p.main_grad
                opt.step()
            if on_gpu:
                torch.cuda.synchronize()
            dist.barrier()
            dt = time.perf_counter() - t0
            if it >= warm:
                times.append(dt)
            losses.append(loss)
        # losses live on the last pipeline stage: gather them to every rank.
        obj = [None] * world
        dist.all_gather_object(obj, {"rank": rank, "losses": losses, "is_last": is_last,
                                     "peak_gib": _peak_mem_gib(on_gpu)})
        # each last-stage rank holds the mean over its own DP shard: average over those ranks
        # (TP/CP/EP replicas of one shard hold the same value, so the mean is the global mean).
        last = [o["losses"] for o in obj if o["is_last"] and o["losses"] and o["losses"][0] is not None]
        mean_losses = [sum(ls[i] for ls in last) / len(last) for i in range(len(last[0]))]
        write({"ok": True, "rank": rank, "step_times_s": times, "losses": mean_losses,
               "peak_memory_gib": [o["peak_gib"] for o in obj], "dp": dp, "num_microbatches": num_mb,
               "versions": _versions(on_gpu), "cpu_patched": patched})
        dist.barrier()
        return 0
    except BaseException as e:  # noqa: BLE001 - every failure is reported, then the rank exits
        kind = "crash"
        msg = f"{type(e).__name__}: {e}"
        if isinstance(e, StackRejected):
            kind, msg = "stack-rejected", str(e)
        elif isinstance(e, MemoryError) or "out of memory" in str(e).lower():
            kind = "oom"
        write({"ok": False, "rank": rank, "kind": kind, "message": msg[:4000], "phase": phase,
               "time": time.time(), "traceback": traceback.format_exc()[-6000:]})
        sys.stderr.write(traceback.format_exc())
        sys.stderr.flush()
        os._exit(1)  # peers may be blocked in a collective; the launcher kills the group


def _versions(on_gpu):
    import megatron.core
    v = {"torch": torch.__version__, "megatron-core": megatron.core.__version__,
         "device": torch.cuda.get_device_name() if on_gpu else "cpu"}
    return v


if __name__ == "__main__":
    rc = main(sys.argv[1])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)  # skip interpreter teardown (gloo/threads) once the result is written
