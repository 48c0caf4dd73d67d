"""The nouns every other package shares, and nothing else: `Plan`, `ModelSpec` (+ `models` loaders
and presets), `Workload`, `StackProfile` (+ what each stack can run, `cpu_support`), Megatron's
pipeline split (`pipeline`) and rank layout (`ranks`), the `InputError` hierarchy (`errors`) and the
one atomic file writer (`fileio`). This package imports no other package of the project."""
