"""Finding a model: a preset name (`specs/presets/models/<name>.yaml`), a YAML file, or a Hugging
Face `config.json` (file or directory holding one)."""
from __future__ import annotations

import dataclasses
import difflib
import os
from pathlib import Path

from specs.errors import SpecError
from specs.hf_config import load_hf_config
from specs.inputs import load_yaml
from specs.model_spec import ModelSpec, from_dict

PRESET_DIR = Path(__file__).parent / "presets" / "models"


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def is_hub_id(ref: str) -> bool:
    """`org/name` that is not a local path: a Hugging Face hub id."""
    parts = ref.split("/")
    return len(parts) == 2 and all(parts) and not Path(ref).exists() and not ref.endswith((".json", ".yaml", ".yml"))


def hf_cache_dir() -> Path:
    """Where huggingface_hub keeps downloaded repositories (its own lookup: HF_HUB_CACHE, else
    HF_HOME/hub, else ~/.cache/huggingface/hub)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
    return Path(home) / "hub"


def cached_hub_config(repo: str) -> Path | None:
    """The config.json of hub repository `repo` in the local Hugging Face cache (the snapshot that
    refs/main names, else any snapshot), or None."""
    d = hf_cache_dir() / ("models--" + repo.replace("/", "--"))
    ref = d / "refs" / "main"
    snaps = [d / "snapshots" / ref.read_text().strip()] if ref.exists() else []
    snaps += sorted((d / "snapshots").glob("*")) if (d / "snapshots").is_dir() else []
    return next((s / "config.json" for s in snaps if (s / "config.json").exists()), None)


def resolve_model_ref(ref: str) -> str:
    """A Hugging Face hub id as the local path of its cached config.json (the model is read from it);
    any other reference unchanged."""
    if is_hub_id(ref):
        cfg = cached_hub_config(ref)
        if cfg is not None:
            return str(cfg)
    return ref


def load_model(ref: str) -> ModelSpec:
    """A preset name, a YAML file, a Hugging Face config.json (file or directory holding one), or a
    Hugging Face hub id whose config.json is in the local cache (nothing is downloaded)."""
    local = resolve_model_ref(ref)
    if local != ref:  # a cached hub id: named after its repository, which is also its source
        return dataclasses.replace(load_hf_config(Path(local)), name=ref.split("/")[1],
                                   source=f"huggingface.co/{ref} config.json (local Hugging Face cache)")
    path = Path(ref)
    if path.is_dir() and (path / "config.json").exists():
        path = path / "config.json"
    if path.suffix == ".json" and path.exists():
        return load_hf_config(path)
    if path.suffix in (".yaml", ".yml") and path.exists():
        return _load_yaml(path, name=None)
    if ref in preset_names():  # only a listed preset: "../x" must not reach a file beside them
        return _load_yaml(PRESET_DIR / f"{ref}.yaml", name=ref)
    if is_hub_id(ref):
        same = [n for n in preset_names() if hf_id(_load_yaml(PRESET_DIR / f"{n}.yaml", name=n)).lower() == ref.lower()]
        alt = f"--model {same[0]} (the preset of that checkpoint)" if same else "a preset (`moetune list models`)"
        raise SpecError(f"model {ref!r} looks like a Hugging Face id, but its config.json is not in the local "
                        f"cache ({hf_cache_dir()}) and moetune does not download: run `huggingface-cli download "
                        f"{ref} config.json`, or pass {alt} or a config.json path")
    near = difflib.get_close_matches(ref, preset_names(), n=1, cutoff=0.5)
    near += [n for n in preset_names() if n.startswith(ref) and n not in near][:1]
    hint = f"did you mean {near[0]!r}? " if near else ""
    raise SpecError(f"unknown model {ref!r}: {hint}not a preset ({', '.join(preset_names())}) "
                    "nor a .yaml/config.json file (see `moetune list models`)")


def _load_yaml(path: Path, name: str | None) -> ModelSpec:
    d = load_yaml(path, "model YAML")
    if isinstance(d, dict) and "name" not in d and name is None:
        d["name"] = path.stem
    return from_dict(d, name=name, where=str(path))


def hf_id(model: ModelSpec) -> str:
    """The Hugging Face repository id a model's numbers come from (`source:
    huggingface.co/<org>/<name> ...` in a preset), or "" when it has none."""
    first = (model.source or "").split()
    if first and first[0].startswith("huggingface.co/") and first[0].count("/") == 2:
        return first[0].removeprefix("huggingface.co/")
    return ""
