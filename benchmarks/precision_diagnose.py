"""What a quickstart SFT model learned, and how far bf16's gradients are from fp32's (issue 23's evidence).

    python benchmarks/precision_diagnose.py runs/quickstart/word-problems/checkpoints/sft/step_800/model
    python benchmarks/precision_diagnose.py MODEL [MODEL ...] --gradients

For each model folder (a quickstart SFT checkpoint):

- per verb, the probability the model gives the right operation (``+``/``-``) on the test split, teacher
  forced on the gold solution up to that operation, against the confused teacher's rate for the verb
  (``1 - confusion``): a model that learned what the task was built for matches it verb by verb; one that
  did not learn the verb-to-operation dependency sits near 0.5 for every verb;
- with ``--gradients``: the gradient of one SFT batch (64 rows of the SFT split) in fp32, and its relative
  error per module under bf16 autocast with a bf16 head and with the fp32 head the trainer uses
  (``trainer/logprobs.py:project_fp32``). bf16 runs through ``trivium/models/bf16.py`` (emulated where the
  CPU has no bf16 instructions: the same numbers up to summation order).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import re
import statistics
from pathlib import Path

import torch

from trivium.models.bf16 import bf16_autocast, bf16_emulation
from trivium.models.loading import load_tokenizer
from trivium.tasks.word_problems import VERBS

DATA = Path(__file__).resolve().parents[1] / "examples" / "quickstart" / "data"
STEMS = [v.phrase.split(" {n}")[0] for v in VERBS]


def _rows(split: str) -> list[dict]:
    return [json.loads(x) for x in (DATA / f"{split}.jsonl").read_text().splitlines() if x.strip()]


def _prompt(tokenizer, question: str) -> str:
    return tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False
    )


def verb_calibration(model, tokenizer) -> dict[str, tuple[float, float, int]]:
    """verb -> (teacher's rate of the right operation, the model's mean P(right operation), count)."""
    per: dict[int, list[float]] = {i: [] for i in range(len(VERBS))}
    for row in _rows("test"):
        sentences = re.split(r"(?<=\.) ", row["question"])[1:]
        verbs = [next(i for i, st in enumerate(STEMS) if f" {st} " in f" {s} ") for s in sentences[:-1]]
        lines = row["answer"].split("\n")[:-1]
        prompt = _prompt(tokenizer, row["question"])
        for k, (line, verb) in enumerate(zip(lines, verbs)):
            first, op = re.match(r"(\d+)([+-])", line).groups()
            prefix = prompt + "".join(x + "\n" for x in lines[:k]) + first
            ids = tokenizer(prefix, add_special_tokens=False, return_tensors="pt")["input_ids"]
            with torch.no_grad():
                probs = model(input_ids=ids).logits[0, -1].float().softmax(-1)
            per[verb].append(float(probs[tokenizer.convert_tokens_to_ids(op)]))
    return {STEMS[i]: (1 - VERBS[i].confusion, statistics.mean(p), len(p)) for i, p in per.items() if p}


def sft_batch(tokenizer, n: int = 64):
    rows = _rows("sft")
    random.Random(0).shuffle(rows)
    ids, masks = [], []
    for row in rows[:n]:
        a = tokenizer(_prompt(tokenizer, row["question"]), add_special_tokens=False)["input_ids"]
        b = tokenizer(row["answer"] + tokenizer.eos_token, add_special_tokens=False)["input_ids"]
        ids.append(a + b)
        masks.append([0] * len(a) + [1] * len(b))
    width = max(map(len, ids))
    pad = tokenizer.pad_token_id
    x = torch.tensor([i + [pad] * (width - len(i)) for i in ids])
    mask = torch.tensor([m + [0] * (width - len(m)) for m in masks]).bool()
    attention = torch.tensor([[1] * len(i) + [0] * (width - len(i)) for i in ids])
    return x, mask, attention


def gradients(model, batch, mode: str) -> tuple[float, dict[str, torch.Tensor]]:
    """SFT loss and per-parameter gradients of ``batch`` in ``mode``: fp32, bf16 (bf16 head), bf16-fp32-head."""
    x, mask, attention = batch
    low = mode != "fp32"
    with bf16_autocast("cpu") if low else contextlib.nullcontext():
        hidden = model(
            input_ids=x,
            attention_mask=attention,
            output_hidden_states=True,
            logits_to_keep=torch.empty(0, dtype=torch.long),
        ).hidden_states[-1]
        where = mask[:, 1:]
        h = hidden[:, :-1][where]
        head = model.get_output_embeddings()
        if mode == "bf16-fp32-head":
            with torch.autocast("cpu", enabled=False):
                logits = head(h.float())
        else:
            logits = head(h).float()
    loss = -logits.log_softmax(-1).gather(-1, x[:, 1:][where].unsqueeze(-1)).mean()
    with bf16_emulation("cpu") if low else contextlib.nullcontext():
        loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return float(loss.detach()), grads


def _module(name: str) -> str:
    if "embed" in name:
        return "embedding / head (tied)"
    parts = name.split(".")
    return parts[-2] if "layers" in name else ".".join(parts[-2:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+", help="quickstart model folders (SFT checkpoints)")
    ap.add_argument("--gradients", action="store_true", help="also compare bf16 gradients with fp32's")
    args = ap.parse_args()
    from transformers import AutoModelForCausalLM

    for folder in args.models:
        tokenizer = load_tokenizer(folder)
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        print(f"== {folder}")
        table = verb_calibration(model, tokenizer)
        for verb, (rate, p, n) in table.items():
            print(f"  {verb:11s} teacher right {rate:.2f}   model P(right operation) {p:.3f}   ({n} steps)")
        error = statistics.mean(abs(p - rate) for rate, p, _ in table.values())
        print(f"  mean |model - teacher| over verbs: {error:.3f} (~0.03: learned the verbs; ~0.25: did not)")
        if not args.gradients:
            continue
        batch = sft_batch(tokenizer)
        loss32, g32 = gradients(model, batch, "fp32")
        print(f"  one SFT batch, fp32 loss {loss32:.5f}; bf16 against it (relative error of the gradient):")
        for mode in ("bf16", "bf16-fp32-head"):
            loss, g = gradients(model, batch, mode)
            err: dict[str, list[float]] = {}
            for name, ref in g32.items():
                e = err.setdefault(_module(name), [0.0, 0.0])
                e[0] += float((g[name] - ref).pow(2).sum())
                e[1] += float(ref.pow(2).sum())
            total = sum(e[0] for e in err.values()) / sum(e[1] for e in err.values())
            parts = ", ".join(f"{k} {(a / b) ** 0.5:.4f}" for k, (a, b) in err.items())
            print(f"  {mode:15s} loss error {loss - loss32:+.2e}; gradient {total**0.5:.4f} overall; {parts}")


if __name__ == "__main__":
    main()
