"""Round-to-nearest int4 export of a checkpoint in AutoAWQ's GEMM layout, for benchmarking the int4 path on a model
that ships no AWQ/GPTQ export (the bundled one).

Each q/k/v/o/gate/up/down projection is quantized per group of `--group-size` input columns, asymmetric with a
4-bit zero point and a float16 scale ((max - min) / 15), and packed 8 nibbles per int32 (kernels/int4_weight.py's
pack_int4); embeddings, norms and the lm_head are copied as they are. Plain RTN, no activation-aware scaling: the
weights' bytes and the serving arithmetic are AWQ's, its accuracy is not (AWQ's calibration is what keeps quality).

    python -m bench.quantize_int4 --model bundled:smollm2-135m-instruct --out /tmp/smollm2-awq --group-size 64

The output directory must not exist and must lie outside the source tree.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from shared.kernels.int4_weight import pack_int4

_PROJ = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# the weights' index (the export writes its own files) and the bundled model's preparation marker (it describes
# the source, not this export)
_NOT_COPIED = ("model.safetensors.index.json", "pdrelay-prepared.json")
_REPO = Path(__file__).resolve().parent.parent


def quantize_awq(w: torch.Tensor, group: int) -> dict[str, torch.Tensor]:
    """[out, in] weight -> AWQ's qweight [in, out / 8], qzeros [in / group, out / 8] and scales [in / group, out]."""
    out, k = w.shape
    g = w.float().view(out, k // group, group)
    lo, hi = g.amin(-1).clamp(max=0), g.amax(-1).clamp(min=0)  # the range holds 0: zero is exactly representable
    scale = ((hi - lo).clamp(min=1e-8) / 15).to(torch.float16)
    s = scale.float()
    zero = (-lo / s).round().clamp(0, 15)
    q = (g / s.unsqueeze(-1)).round().add(zero.unsqueeze(-1)).clamp(0, 15).view(out, k).to(torch.int32)
    return {
        "qweight": pack_int4(q).t().contiguous(),
        "qzeros": pack_int4(zero.to(torch.int32)).t().contiguous(),
        "scales": scale.t().contiguous(),
    }


def export(src: Path, dst: Path, group: int) -> int:
    """Write the int4 copy of `src` into `dst`; returns the projections' packed bytes."""
    dst.mkdir(parents=True)
    for f in src.iterdir():
        if f.is_file() and f.suffix != ".safetensors" and f.name not in _NOT_COPIED:
            shutil.copy2(f, dst / f.name)
    packed = 0
    for i, path in enumerate(sorted(src.glob("*.safetensors"))):
        out: dict[str, torch.Tensor] = {}
        for name, w in load_file(path).items():
            if not (name.endswith(".weight") and name.split(".")[-2] in _PROJ):
                out[name] = w
                continue
            if w.shape[1] % group or w.shape[0] % 8:
                raise SystemExit(f"{name}: {tuple(w.shape)} is not whole groups of {group} inputs and 8 outputs")
            for key, t in quantize_awq(w, group).items():
                out[name.removesuffix("weight") + key] = t
                packed += t.numel() * t.element_size()
        save_file(out, str(dst / f"model-{i:05d}.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((src / "config.json").read_text())
    cfg["quantization_config"] = {
        "quant_method": "awq",
        "bits": 4,
        "group_size": group,
        "zero_point": True,
        "version": "gemm",
    }
    (dst / "config.json").write_text(json.dumps(cfg, indent=2))
    return packed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True, help="bundled:<name> or a local HF model dir")
    ap.add_argument("--out", required=True, type=Path, help="a new directory outside the source tree")
    ap.add_argument("--group-size", type=int, default=128, help="input columns per scale and zero point")
    args = ap.parse_args(argv)
    from shared.modelspec.bundled import resolve_model_path

    out = args.out.resolve()
    if out.exists() or out.is_relative_to(_REPO):
        print(f"--out {args.out}: must be a new directory outside {_REPO}", file=sys.stderr)
        return 2
    src = Path(resolve_model_path(args.model))
    try:
        packed = export(src, out, args.group_size)
    except BaseException:
        shutil.rmtree(out, ignore_errors=True)  # no half-written checkpoint left to load by mistake
        raise
    print(f"wrote {out}: projections {packed / 2**20:.1f} MiB packed (int4 + scales + zeros)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
