"""A plain PyTorch + transformers GRPO loop: the yardstick Trivium's overhead is measured against.

Same workload as the quickstart's GRPO stage: B prompts x G samples with HF ``generate`` (T=1, no
top-k/top-p), exact-answer reward, group-normalised advantages, PPO-clip loss with token-mean
aggregation, one AdamW step per batch, gradient clipping at 1.0. No evaluation, no checkpoints.

    python benchmarks/reference_grpo.py MODEL_DIR TRAIN_JSONL --steps 30

Prints one JSON line per step: {"step", "step_s", "gen_s", "reward"}.
"""

import argparse
import json
import re
import time

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

ANSWER = re.compile(r"####\s*(-?\d+)")


def final_number(text):
    m = ANSWER.search(text)
    return m.group(1) if m else None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model_dir")
    ap.add_argument("train_jsonl")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=24)
    ap.add_argument("--lr", type=float, default=2e-4)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    torch.set_flush_denormal(True)
    torch.manual_seed(args.seed)
    tok = AutoTokenizer.from_pretrained(args.model_dir)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32)
    with open(args.train_jsonl) as f:
        rows = [json.loads(x) for x in f if x.strip()]
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    B, G = args.prompts, args.group
    for step in range(1, args.steps + 1):
        t0 = time.perf_counter()
        batch = [rows[((step - 1) * B + i) % len(rows)] for i in range(B)]
        prompts = [
            tok.apply_chat_template(
                [{"role": "user", "content": r["question"]}], tokenize=False, add_generation_prompt=True
            )
            for r in batch
        ]
        enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        ids = enc["input_ids"].repeat_interleave(G, 0)
        att = enc["attention_mask"].repeat_interleave(G, 0)
        P = ids.shape[1]
        model.eval()
        with torch.no_grad():
            out = model.generate(
                input_ids=ids,
                attention_mask=att,
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                max_new_tokens=args.max_new_tokens,
                pad_token_id=tok.pad_token_id,
                eos_token_id=tok.eos_token_id,
            )
        gen_s = time.perf_counter() - t0
        comp = out[:, P:]
        is_eos = comp == tok.eos_token_id
        first = torch.where(
            is_eos.any(1), is_eos.int().argmax(1), torch.full((comp.shape[0],), comp.shape[1])
        )
        mask = (torch.arange(comp.shape[1])[None] <= first[:, None]).float()
        texts = tok.batch_decode(comp.masked_fill(mask == 0, tok.pad_token_id), skip_special_tokens=True)
        gold = [final_number(r["answer"]) for r in batch for _ in range(G)]
        rewards = torch.tensor([float(final_number(t) == g) for t, g in zip(texts, gold)]).view(B, G)
        adv = ((rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + 1e-6)).view(-1, 1)

        model.train()
        full_att = torch.cat([att, mask.long()], 1)
        logits = model(input_ids=out, attention_mask=full_att).logits[:, P - 1 : -1].float()
        logp = torch.log_softmax(logits, -1).gather(-1, comp.unsqueeze(-1)).squeeze(-1)
        ratio = torch.exp(logp - logp.detach())  # one update per batch: the old policy is the current one
        loss_tok = -torch.min(ratio * adv, ratio.clamp(0.8, 1.2) * adv)
        loss = (loss_tok * mask).sum() / mask.sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        print(
            json.dumps(
                {
                    "step": step,
                    "step_s": time.perf_counter() - t0,
                    "gen_s": gen_s,
                    "reward": rewards.mean().item(),
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
