"""Build the tiny local models the engine contract tests use; no hub access.

Runs inside the vLLM virtual environment (transformers and tokenizers come with vLLM).
- `llama/`: a random-weight Llama (bf16, ~0.4M params) with a byte-level BPE tokenizer trained
  here on generated text: it serves for real, and stands in as draft for draft_model/eagle/eagle3.
- `dflash-draft/`: config only, a Qwen3-shaped draft with vLLM's `DFlashDraftModel`
  architecture, so vLLM validates method dflash against a draft it recognises.
- `deepseek-mtp/`: config only, a DeepSeek-V3-shaped target with one next-n (MTP) layer, so
  vLLM validates method mtp against a target that has MTP heads.
Usage: python build_tiny_model.py OUT_DIR
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    DeepseekV3Config,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    Qwen3Config,
)

VOCAB_SIZE = 1024


def corpus() -> list[str]:
    words = (
        "the quick brown fox jumps over the lazy dog while speculative decoding drafts tokens "
        "that a target model verifies in one pass def return import class for while if else "
        "kubernetes operator deployment service pod metrics prometheus batch latency throughput"
    ).split()
    lines = []
    for i in range(2000):
        lines.append(" ".join(words[(i * 7 + j) % len(words)] for j in range(12)) + f" {i}.")
    return lines


def build_llama(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(models.BPE(unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=["<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>")
    fast.chat_template = (
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"
    )
    fast.save_pretrained(out)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        torch_dtype="bfloat16",
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out)


def build_config_only(out: Path, config: object, tokenizer_from: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(out)  # type: ignore[attr-defined]
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_from / name, out / name)


def main(out_dir: str) -> None:
    root = Path(out_dir)
    llama = root / "llama"
    build_llama(llama)
    dflash = Qwen3Config(
        vocab_size=VOCAB_SIZE,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        max_position_embeddings=2048,
    )
    dflash.architectures = ["DFlashDraftModel"]
    dflash.dflash_config = {"block_size": 4, "target_layer_ids": [0, 1]}
    build_config_only(root / "dflash-draft", dflash, llama)
    mtp = DeepseekV3Config(
        vocab_size=VOCAB_SIZE,
        hidden_size=128,
        intermediate_size=256,
        moe_intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
        first_k_dense_replace=1,
        kv_lora_rank=32,
        q_lora_rank=64,
        qk_rope_head_dim=16,
        qk_nope_head_dim=16,
        v_head_dim=32,
        max_position_embeddings=2048,
        num_nextn_predict_layers=1,
    )
    mtp.architectures = ["DeepseekV3ForCausalLM"]
    build_config_only(root / "deepseek-mtp", mtp, llama)
    print(root)


if __name__ == "__main__":
    main(sys.argv[1])
