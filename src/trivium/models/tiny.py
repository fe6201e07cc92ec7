"""Build a tiny, fully local causal LM (tokenizer + random weights) for tests, examples and CPU runs.

Design decisions:
- Everything is made here from the caller's corpus: a byte-level BPE tokenizer is trained with ``tokenizers``
  and the model is a randomly initialised ``Qwen2ForCausalLM`` (or ``LlamaForCausalLM``). Nothing comes
  from a hub, so tests run offline.
- Digits are split one per token, so arithmetic tasks see the same token for "7" wherever it appears.
- The output folder is an ordinary ``save_pretrained`` checkpoint (safetensors), loaded by
  ``AutoTokenizer`` / ``AutoModelForCausalLM.from_pretrained(out_dir)`` like any hub model.
- Deterministic: the same corpus and seed give byte-identical ``model.safetensors`` and ``tokenizer.json``.
  The seed is applied inside ``torch.random.fork_rng`` so building a model leaves the caller's RNG alone.

Left out on purpose: a default corpus (the caller always passes text that looks like its task) and any
training; a warm-up SFT belongs to the caller.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import torch

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerFast

__all__ = ["CHAT_TEMPLATE", "SPECIAL_TOKENS", "byte_level_pipeline", "make_tiny", "wrap_tokenizer"]

PAD, EOS, SYSTEM, USER, ASSISTANT = "<|pad|>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>"
SPECIAL_TOKENS = (PAD, EOS, SYSTEM, USER, ASSISTANT)

# Every turn is "<|role|>\n{content}\n"; assistant turns end with the eos token instead, so a policy learns to
# stop by emitting <|end|>. Tools (OpenAI schema) are listed in the system turn; an assistant's tool_calls are
# written as <tool_call> JSON blocks and tool results as a user turn wrapped in <tool_response>, the Qwen2.5
# conventions (trivium/tools/calls.py). An unknown role raises instead of silently vanishing from the prompt.
CHAT_TEMPLATE = (
    "{% if tools %}<|system|>\n"
    "{% if messages and messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}\n{% endif %}"
    "Tools:{% for t in tools %}{{ '\\n' }}{{ (t['function'] if 'function' in t else t) | tojson }}{% endfor %}{{ '\\n' }}"
    "{% endif %}"
    "{% for m in messages %}"
    "{% if m['role'] == 'system' %}{% if not (tools and loop.first) %}<|system|>\n{{ m['content'] }}\n{% endif %}"
    "{% elif m['role'] == 'user' %}<|user|>\n{{ m['content'] }}\n"
    "{% elif m['role'] == 'assistant' %}<|assistant|>\n{{ m['content'] if m['content'] else '' }}"
    "{% for c in (m['tool_calls'] if m['tool_calls'] is defined and m['tool_calls'] else []) %}"
    "{% set f = c['function'] if 'function' in c else c %}"
    "{% if not loop.first or m['content'] %}{{ '\\n' }}{% endif %}"
    '<tool_call>\n{"name": {{ f[\'name\'] | tojson }}, "arguments": '
    "{{ f['arguments'] if f['arguments'] is string else f['arguments'] | tojson }}}\n</tool_call>"
    "{% endfor %}<|end|>\n"
    "{% elif m['role'] == 'tool' %}<|user|>\n<tool_response>\n{{ m['content'] }}\n</tool_response>\n"
    "{% else %}{{ raise_exception('Unknown chat role ' ~ m['role'] ~ '; use system, user, assistant or tool') }}"
    "{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

Architecture = Literal["qwen2", "llama"]


def make_tiny(
    out_dir: str | Path,
    corpus: Iterable[str],
    *,
    vocab_size: int = 384,
    hidden_size: int = 128,
    num_layers: int = 4,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 512,
    max_position_embeddings: int = 512,
    architecture: Architecture = "qwen2",
    seed: int = 0,
) -> Path:
    """Train a tokenizer on ``corpus``, build a randomly initialised model and save both to ``out_dir``.

    ``vocab_size`` is an upper bound including the 5 special tokens: a small corpus allows fewer BPE merges,
    and the model's embedding matrix is sized to the tokenizer actually trained (``len(tokenizer)``).
    The defaults give about 1 M parameters (hidden 128, 4 layers). Returns ``Path(out_dir)``.
    """
    texts = [t for t in corpus if t]
    if not texts:
        raise ValueError("make_tiny() needs a non-empty corpus: pass some text that looks like your task")
    if hidden_size % num_heads or num_heads % num_kv_heads:
        raise ValueError(
            f"make_tiny(): hidden_size={hidden_size} must be divisible by num_heads={num_heads}, and "
            f"num_heads by num_kv_heads={num_kv_heads}"
        )
    if vocab_size < len(SPECIAL_TOKENS) + 256:
        raise ValueError(
            f"make_tiny(): vocab_size={vocab_size} must be >= 261 (256 bytes + 5 special tokens)"
        )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(texts, vocab_size, max_position_embeddings)
    model = build_model(
        tokenizer,
        architecture=architecture,
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
        seed=seed,
    )
    tokenizer.save_pretrained(out)
    model.save_pretrained(out)
    check_round_trip(out, tokenizer, texts[:256])
    return out


def text_sizes(**given: int) -> dict[str, int]:
    """``make_tiny``'s size and seed arguments with their defaults, ``given`` ones replaced (a tiny
    vision-language model's language model takes the same ones)."""
    import inspect

    names = ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size")
    params = inspect.signature(make_tiny).parameters
    defaults = {k: params[k].default for k in (*names, "max_position_embeddings", "seed")}
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        raise TypeError(f"unknown tiny model sizes {unknown}; known: {sorted(defaults)}")
    return defaults | given


def build_tokenizer(texts: list[str], vocab_size: int, model_max_length: int) -> PreTrainedTokenizerFast:
    """Byte-level BPE with one token per digit, wrapped for transformers (pad, eos, chat template).

    The normaliser and pre-tokeniser are exactly those transformers' ``Qwen2Tokenizer`` rebuilds when
    ``AutoTokenizer`` loads a folder whose ``config.json`` says qwen2 (it keeps only vocab and merges); with
    anything else the loaded tokenizer would split text differently from the one trained here. Its regex
    already isolates every digit (``\\p{N}``). ``unk_token``/``bos_token`` are saved as null, otherwise
    ``Qwen2Tokenizer`` appends an ``<|endoftext|>`` token the model has no embedding for.
    """
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = byte_level_pipeline(Tokenizer(models.BPE()))
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    return wrap_tokenizer(tok, model_max_length)


def byte_level_pipeline(tok):
    """``tok`` (a ``tokenizers.Tokenizer``) with the normaliser, pre-tokeniser and decoder transformers'
    ``Qwen2Tokenizer`` rebuilds (see ``build_tokenizer``)."""
    from tokenizers import Regex, decoders, normalizers, pre_tokenizers
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    return tok


def wrap_tokenizer(tok, model_max_length: int) -> PreTrainedTokenizerFast:
    """A ``tokenizers.Tokenizer`` holding ``SPECIAL_TOKENS`` as a transformers tokenizer: pad, eos, the role
    tokens and the chat template."""
    from transformers import PreTrainedTokenizerFast

    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=PAD,
        eos_token=EOS,
        unk_token=None,
        bos_token=None,
        additional_special_tokens=[SYSTEM, USER, ASSISTANT],
        model_max_length=model_max_length,
    )
    wrapped.chat_template = CHAT_TEMPLATE
    return wrapped


def check_round_trip(out: Path, tokenizer: PreTrainedTokenizerFast, texts: list[str]) -> None:
    """Fail loudly if ``AutoTokenizer.from_pretrained(out)`` does not tokenise like the trained tokenizer."""
    from transformers import AutoTokenizer

    loaded = AutoTokenizer.from_pretrained(out)
    bad = [t for t in texts if loaded(t)["input_ids"] != tokenizer(t)["input_ids"]]
    if len(loaded) != len(tokenizer) or bad:
        raise RuntimeError(
            f"make_tiny(): AutoTokenizer loads {type(loaded).__name__} from {out} with {len(loaded)} tokens "
            f"(trained: {len(tokenizer)}) and tokenises {len(bad)} of {len(texts)} sample texts differently, "
            f"e.g. {bad[:1]!r}. The installed transformers rebuilds this tokenizer another way; update "
            "build_tokenizer() in trivium/models/tiny.py to match it."
        )


def architecture_config(
    architecture: str,
    *,
    vocab_size: int,
    hidden_size: int,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    intermediate_size: int,
    **extra,
):
    """The transformers config of a tiny model (tied embeddings); ``extra``: further config fields."""
    from transformers import LlamaConfig, Qwen2Config

    classes = {"qwen2": Qwen2Config, "llama": LlamaConfig, "qwen2_vl": Qwen2Config}  # a VLM's language model
    if architecture not in classes:
        raise ValueError(f"tiny model: architecture={architecture!r} is not one of {sorted(classes)}")
    return classes[architecture](
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        tie_word_embeddings=True,
        **extra,
    )


def recipe_config(tiny, vocab_size: int | None = None):
    """The transformers config a ``model.tiny`` recipe (``TinyModelConfig``) builds, before its tokenizer
    exists: ``vocab_size`` is the tokenizer's where known, else the recipe's target size."""
    return architecture_config(
        tiny.architecture,
        vocab_size=vocab_size or tiny.vocab_size,
        hidden_size=tiny.hidden_size,
        num_layers=tiny.num_layers,
        num_heads=tiny.num_heads,
        num_kv_heads=tiny.num_kv_heads,
        intermediate_size=tiny.intermediate_size,
    )


def build_model(
    tokenizer: PreTrainedTokenizerFast,
    *,
    architecture: Architecture,
    hidden_size: int,
    num_layers: int,
    num_heads: int,
    num_kv_heads: int,
    intermediate_size: int,
    max_position_embeddings: int,
    seed: int,
) -> PreTrainedModel:
    """A randomly initialised causal LM with tied embeddings, sized to ``tokenizer``; fp32 on CPU."""
    from transformers import GenerationConfig, LlamaForCausalLM, Qwen2ForCausalLM

    config = architecture_config(
        architecture,
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = {"qwen2": Qwen2ForCausalLM, "llama": LlamaForCausalLM}[architecture](config)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    return model.eval()
