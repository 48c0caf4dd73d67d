"""Finding a model: a preset name (`specs/presets/models/<name>.yaml`), a YAML file, or a Hugging
Face `config.json` (file or directory holding one)."""
from __future__ import annotations

from pathlib import Path

import yaml

from specs.errors import SpecError
from specs.hf_config import load_hf_config
from specs.model_spec import ModelSpec, from_dict

PRESET_DIR = Path(__file__).parent / "presets" / "models"


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def load_model(ref: str) -> ModelSpec:
    """A preset name, a YAML file, or a Hugging Face config.json (file or directory holding one)."""
    path = Path(ref)
    if path.is_dir() and (path / "config.json").exists():
        path = path / "config.json"
    if path.suffix == ".json" and path.exists():
        return load_hf_config(path)
    if path.suffix in (".yaml", ".yml") and path.exists():
        return _load_yaml(path, name=None)
    preset = PRESET_DIR / f"{ref}.yaml"
    if preset.exists():
        return _load_yaml(preset, name=ref)
    raise SpecError(f"unknown model {ref!r}: not a preset ({', '.join(preset_names())}) "
                    "nor a .yaml/config.json file")


def _load_yaml(path: Path, name: str | None) -> ModelSpec:
    try:
        d = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        first = str(e).splitlines()[0] if str(e) else "parse error"
        raise SpecError(f"malformed YAML in {path}: {first}") from None
    if isinstance(d, dict) and "name" not in d and name is None:
        d["name"] = path.stem
    return from_dict(d, name=name)


def hf_id(model: ModelSpec) -> str:
    """The Hugging Face repository id a model's numbers come from (`source:
    huggingface.co/<org>/<name> ...` in a preset), or "" when it has none."""
    first = (model.source or "").split()
    if first and first[0].startswith("huggingface.co/") and first[0].count("/") == 2:
        return first[0].removeprefix("huggingface.co/")
    return ""
