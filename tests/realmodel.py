"""A tiny real model made on the spot: random Llama weights saved with safetensors and a small BPE
tokenizer trained with `tokenizers` on text the repository ships. A real load path, no download."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ("README.md", "docs/DESIGN.md", "kernels/README.md", "integration/README.md", "loadgen/README.md",
          "traces/README.md")
VOCAB = 1024  # tokenizer vocabulary; the model's vocab_size equals it


def train_tokenizer(out_dir: Path, vocab: int = VOCAB) -> None:
    """A byte-level BPE tokenizer (BOS added to every prompt, as Llama's) saved for transformers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([(ROOT / p).read_text(encoding="utf-8") for p in CORPUS], trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>").save_pretrained(out_dir)


def make_tiny_real_llama(out_dir: Path, seed: int = 0) -> Path:
    """out_dir with config.json, model.safetensors (seeded random weights) and the tokenizer."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out_dir.mkdir(parents=True, exist_ok=True)
    train_tokenizer(out_dir)
    cfg = json.loads((ROOT / "integration/models/tiny-llama/config.json").read_text())
    cfg.update(vocab_size=VOCAB, bos_token_id=0, eos_token_id=1)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**{k: v for k, v in cfg.items() if k != "architectures"}))
    model.save_pretrained(out_dir, safe_serialization=True)
    return out_dir
