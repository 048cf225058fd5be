"""The ``tiny`` model: a small Qwen2-architecture model generated locally, so the LLM step runs anywhere.

Deterministic: a byte-level BPE tokenizer trained on the shipped ``data/tiny_corpus.txt`` with Qwen2's
pre-tokenisation and Qwen2.5's chat template, and random weights seeded by each tensor's name, saved as an ordinary
transformers model directory and loaded by the code that loads the real model.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import zlib
from pathlib import Path
from typing import Any

from gpulab.core.paths import PACKAGE_DIR
from gpulab.llm.models import CHAT_TEMPLATE

CORPUS = PACKAGE_DIR / "llm" / "data" / "tiny_corpus.txt"
ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)
BPE_VOCAB_SIZE = 1024
# Qwen2's pre-tokeniser split (transformers' Qwen2Tokenizer uses the same pattern).
PRETOKENIZE_REGEX = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
                     r"""\s*[\r\n]+|\s+(?!\S)|\s+""")
# Qwen2.5-7B's shape scaled down: GQA (2 query heads per KV head), q/k/v biases, untied lm_head, RoPE.
ARCH: dict[str, Any] = {
    "hidden_size": 128,
    "intermediate_size": 688,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 4096,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-06,
    "hidden_act": "silu",
    "initializer_range": 0.02,
    "tie_word_embeddings": False,
    "use_sliding_window": False,
    "sliding_window": 4096,
    "attention_dropout": 0.0,
}
WEIGHT_STD = 0.02
NORM_STD = 0.1  # norm weights are 1 + noise, so a wrong norm weight changes the output


def train_tokenizer(text: str, vocab_size: int = BPE_VOCAB_SIZE) -> Any:
    """A byte-level BPE with Qwen2's normaliser, pre-tokeniser and decoder, special tokens appended last."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers.models import BPE
    from tokenizers.trainers import BpeTrainer

    tokenizer = Tokenizer(BPE(unk_token=None, continuing_subword_prefix="", end_of_word_suffix="",
                              fuse_unk=False, byte_fallback=False))
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                         initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    tokenizer.train_from_iterator(text.splitlines(keepends=True), trainer=trainer)
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    return tokenizer


def tokenizer_config(tokenizer: Any, max_length: int) -> dict[str, Any]:
    """tokenizer_config.json in the layout Qwen2.5's own file has."""
    added = {str(tokenizer.token_to_id(t)): {"content": t, "lstrip": False, "normalized": False, "rstrip": False,
                                             "single_word": False, "special": True} for t in SPECIAL_TOKENS}
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "additional_special_tokens": [IM_START, IM_END],
        "bos_token": None,
        "chat_template": CHAT_TEMPLATE.read_text(encoding="utf-8"),
        "clean_up_tokenization_spaces": False,
        "eos_token": IM_END,
        "errors": "replace",
        "model_max_length": max_length,
        "pad_token": ENDOFTEXT,
        "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer",
        "unk_token": None,
    }


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def fill_weights(model: Any, seed: int) -> None:
    """Deterministic random weights: each tensor from its own generator, seeded by ``seed`` and its name.

    Independent of the order or the functions transformers uses to initialise modules, so the tiny
    model is the same across transformers versions.
    """
    import torch

    with torch.no_grad():
        for name, tensor in sorted(model.state_dict().items()):
            generator = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
            noise = torch.randn(tensor.shape, generator=generator, dtype=torch.float32)
            value = 1.0 + NORM_STD * noise if name.endswith("norm.weight") else WEIGHT_STD * noise
            tensor.copy_(value.to(tensor.dtype))


def build_tiny(out_dir: str | Path, seed: int = 0, corpus: Path = CORPUS) -> Path:
    """Write the tiny model directory at ``out_dir`` (atomically: a failed build leaves nothing)."""
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    out = Path(out_dir)
    tokenizer = train_tokenizer(corpus.read_text(encoding="utf-8"))
    ids = {t: tokenizer.token_to_id(t) for t in SPECIAL_TOKENS}
    config = Qwen2Config(**ARCH, vocab_size=_round_up(tokenizer.get_vocab_size(), 64),
                         bos_token_id=ids[ENDOFTEXT], eos_token_id=ids[IM_END])
    model = Qwen2ForCausalLM(config)
    fill_weights(model, seed)
    model = model.to(torch.bfloat16)
    # The real model's sampling defaults (generation_config.json of Qwen2.5-7B-Instruct), tiny's token ids.
    model.generation_config = GenerationConfig(
        bos_token_id=ids[ENDOFTEXT], pad_token_id=ids[ENDOFTEXT], eos_token_id=[ids[IM_END], ids[ENDOFTEXT]],
        do_sample=True, temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.05)

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{out.name}."))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save(str(tmp / "tokenizer.json"))
        (tmp / "tokenizer_config.json").write_text(
            json.dumps(tokenizer_config(tokenizer, ARCH["max_position_embeddings"]), indent=2, ensure_ascii=False)
            + "\n", encoding="utf-8")
        (tmp / "gpulab_tiny.json").write_text(json.dumps({
            "seed": seed, "corpus": corpus.name, "corpus_crc32": zlib.crc32(corpus.read_bytes()),
            "tokenizer_vocab": tokenizer.get_vocab_size(), "parameters": sum(p.numel() for p in model.parameters()),
        }, indent=2) + "\n", encoding="utf-8")
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
