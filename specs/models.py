"""Finding a model: a preset name (`specs/presets/models/<name>.yaml`), a YAML file, or a Hugging
Face `config.json` (file or directory holding one)."""
from __future__ import annotations

from pathlib import Path

from specs.errors import SpecError
from specs.hf_config import load_hf_config
from specs.inputs import load_yaml
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
    if ref in preset_names():  # only a listed preset: "../x" must not reach a file beside them
        return _load_yaml(PRESET_DIR / f"{ref}.yaml", name=ref)
    raise SpecError(f"unknown model {ref!r}: not a preset ({', '.join(preset_names())}) "
                    "nor a .yaml/config.json file")


def _load_yaml(path: Path, name: str | None) -> ModelSpec:
    d = load_yaml(path, "model YAML")
    if isinstance(d, dict) and "name" not in d and name is None:
        d["name"] = path.stem
    return from_dict(d, name=name, where=str(path))
