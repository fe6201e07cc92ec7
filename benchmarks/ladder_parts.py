"""The pieces of ``benchmarks/ladder.py``: the rungs' models and prompts, the shared reward, TRL's side.

Models are random-initialised (speed and memory do not need a trained model): a Qwen2 of the rung's shape
and a byte-level BPE tokenizer of exactly the rung's vocabulary. The tokenizer is built, not trained: its
merges spell every 2-, 3- and 4-letter lowercase word in turn until the vocabulary is full (151,936 entries
at the Qwen2.5 shape, like that model's embedding), so a random model samples from the whole vocabulary and
every id decodes to text. Prompts are lowercase words cut to the rung's prompt length in tokens.

The reward (``letter_reward``) is the share of the response's letters in a..m: it spreads within a group of
random samples, so every group has advantages and both frameworks train every sequence (a constant reward
would let one of them skip the update).
"""

from __future__ import annotations

import itertools
import json
import random
import resource
import string
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# name: (hidden, layers, heads, kv heads, intermediate, vocab)
SHAPES = {
    "1M": (128, 4, 4, 2, 512, 384),  # the quickstart's model
    "25M": (512, 8, 8, 4, 1536, 512),  # benchmarks/engines.py's w25m model
    "100M": (768, 12, 12, 4, 2048, 32_000),
    "0.5B": (896, 24, 14, 2, 4864, 151_936),  # Qwen2.5-0.5B's shape
    "ci-152k": (64, 2, 2, 1, 128, 151_936),  # --quick: the 152k vocabulary on a 2-layer model
}


def qwen2_config(shape: str):
    """The transformers config of a SHAPES rung (tied embedding, like the tiny models and Qwen2.5-0.5B)."""
    from transformers import Qwen2Config

    hidden, layers, heads, kv, inter, vocab = SHAPES[shape]
    return Qwen2Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        tie_word_embeddings=True,
    )


def publish(name: str, text: str, data, write: bool = True) -> None:
    """Print a benchmark's table and, unless ``write`` is off, keep it with its data as
    benchmarks/results/NAME.md and NAME.json."""
    print(text)
    if write:
        results = Path(__file__).resolve().parent / "results"
        results.mkdir(parents=True, exist_ok=True)
        (results / f"{name}.md").write_text(text)
        (results / f"{name}.json").write_text(json.dumps(data, indent=1) + "\n")


def letter_reward(response: str, data: Mapping[str, Any]):
    """Share of the response's letters that are in a..m (0.5 for a response with no letters)."""
    from trivium.rewards.registry import RewardResult

    letters = [c for c in response.lower() if c in string.ascii_lowercase]
    share = sum(c <= "m" for c in letters) / len(letters) if letters else 0.5
    return RewardResult(share, {"letters": float(len(letters))})


def build_tokenizer(vocab_size: int, max_length: int):
    """A byte-level BPE tokenizer of exactly ``vocab_size`` entries (module docstring), with the tiny models'
    special tokens and chat template."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    from trivium.models.tiny import SPECIAL_TOKENS, byte_level_pipeline, wrap_tokenizer

    vocab = {t: i for i, t in enumerate(SPECIAL_TOKENS)}
    for ch in pre_tokenizers.ByteLevel.alphabet():
        vocab.setdefault(ch, len(vocab))
    merges: list[tuple[str, str]] = []
    words = ("".join(w) for n in (2, 3, 4, 5) for w in itertools.product(string.ascii_lowercase, repeat=n))
    while len(vocab) < vocab_size:
        word = next(words)
        merges.append((word[:-1], word[-1]))
        vocab[word] = len(vocab)
    tok = byte_level_pipeline(Tokenizer(models.BPE(vocab=vocab, merges=merges)))
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    return wrap_tokenizer(tok, max_length)


def make_model(shape: str, out: Path, max_length: int = 8192) -> Path:
    """The rung's model folder (made once, reused)."""
    if (out / "config.json").exists():
        return out
    from trivium.models.tiny import build_model, check_round_trip

    hidden, layers, heads, kv, inter, vocab = SHAPES[shape]
    tok = build_tokenizer(vocab, max_length)
    model = build_model(
        tok,
        architecture="qwen2",
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv,
        intermediate_size=inter,
        max_position_embeddings=max_length,
        seed=0,
    )
    out.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(out)
    model.save_pretrained(out)
    check_round_trip(out, tok, [prompt_text(random.Random(i), 40) for i in range(8)])
    return out


def prompt_text(rng: random.Random, words: int) -> str:
    return "sort these: " + " ".join(
        "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(3, 6))) for _ in range(words)
    )


def make_prompts(model_dir: Path, prompt_tokens: int, n: int, out: Path) -> Path:
    """``n`` task rows whose chat prompt is ``prompt_tokens`` tokens long (within a token or two)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    rng = random.Random(0)
    rows = []
    for _ in range(n):
        text = prompt_text(rng, prompt_tokens // 2 + 8)  # 2-3 tokens a word: long enough, then cut
        ids = tok(text, add_special_tokens=False)["input_ids"]
        chat = tok.apply_chat_template(
            [{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True
        )
        over = len(tok(chat, add_special_tokens=False)["input_ids"]) - len(ids)  # the template's tokens
        ids = ids[: max(prompt_tokens - over, 1)]
        rows.append({"question": tok.decode(ids), "answer": "a"})  # the math workflow wants one
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return out


# --- TRL's side: one run in this process, one JSON line per step ------------------------------------------
def run_trl(model_dir: Path, data: Path, prompts: int, group: int, max_tokens: int, steps: int, bf16: bool):
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback
    from trl import GRPOTrainer
    from trl_side import clock, grpo_config

    torch.set_flush_denormal(True)
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    rows = [json.loads(x) for x in data.read_text().splitlines()][: steps * prompts]
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": r["question"]}]} for r in rows])

    def reward(completions, **_):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [letter_reward(t, {}).reward for t in texts]

    step_clock, _ = clock(model, tok)
    cfg = grpo_config(
        steps=steps,
        prompts=prompts,
        group=group,
        max_tokens=max_tokens,
        lr=1e-5,
        bf16=bf16,
        checkpointing=False,
    )  # without gradient checkpointing: TRL's fastest (its default, on, recomputes activations)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=cfg,
        train_dataset=dataset,
        processing_class=tok,
        callbacks=[step_clock],
    )
    trainer.remove_callback(PrinterCallback)
    trainer.train()
    print(
        json.dumps({"summary": {"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}}),
        flush=True,
    )


if __name__ == "__main__":  # python ladder_parts.py trl MODEL DATA PROMPTS GROUP MAX_TOKENS STEPS BF16
    _, side, m, d, p, g, t, s, b = sys.argv
    run_trl(Path(m), Path(d), int(p), int(g), int(t), int(s), b == "1")
