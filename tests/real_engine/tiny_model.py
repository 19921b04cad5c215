"""Build a tiny random-weight Llama that real sglang can serve on a CPU, without a download: a
transformers config, random weights (seeded), and a byte-level BPE tokenizer trained on GSM8K's train
split with `tokenizers`, plus a chat template. Random weights score 0 on GSM8K, but are
deterministic: greedy answers are reproducible, and log-probabilities compare across servers.

Run it under the sglang environment's interpreter (it needs torch, transformers, tokenizers):

    .sglang-0.5.23/bin/python tests/real_engine/tiny_model.py OUT_DIR GSM8K_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

VOCAB = 2048
# Weights drawn wider than transformers' 0.02: at 0.02 a random model's next-token distribution is nearly
# flat (log-probabilities -8 to -7) whatever the context, so a wrong context moves it little.
INIT_STD = 0.25
CHAT_TEMPLATE = ("{% for message in messages %}<|{{ message['role'] }}|>\n{{ message['content'] }}</s>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


def build(out: Path, gsm8k: Path) -> Path:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    build_id = out / "regress-build.json"  # a model built by an earlier version of this script is rebuilt
    wanted = json.dumps({"vocab": VOCAB, "init_std": INIT_STD})
    if (out / "model.safetensors").is_file() and build_id.is_file() and build_id.read_text() == wanted:
        return out
    out.mkdir(parents=True, exist_ok=True)
    texts = [row["question"] + "\n" + row["answer"]
             for row in map(json.loads, (gsm8k / "train.jsonl").read_text().splitlines()[:3000])]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<s>", "</s>", "<unk>"],
                                                               initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                         bos_token_id=0, eos_token_id=1, torch_dtype="bfloat16", tie_word_embeddings=False,
                         initializer_range=INIT_STD)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    build_id.write_text(wanted)
    return out


if __name__ == "__main__":
    print(build(Path(sys.argv[1]), Path(sys.argv[2])))
