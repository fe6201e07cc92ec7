"""TRL's GRPOTrainer against ``trivium run`` on the same SFT checkpoint, data and settings, alternating.

    pip install -e '.[bench]'                    # TRL
    python benchmarks/vs_trl.py --repeats 2      # (a) the quickstart workload, 100 steps (~8 min a pair)
    python benchmarks/vs_trl.py --workload w25m  # (b) the 25M model, ~100-token answers, 8 steps
    python benchmarks/vs_trl.py --steps 3 --eval-every 3 --n-eval 32     # a smoke test

Workloads (the SFT checkpoint is made once into ``--work``, default ``benchmarks/workdir``, gitignored, by
the recipes of ``benchmarks/engines.py``; ``--model DIR`` starts from another one):

- ``quickstart`` (a): the quickstart's GRPO stage from its SFT checkpoint (~1M parameters): 16 prompts x 8
  samples of its train set (in file order), <= 24 new tokens, lr 2e-4, 100 steps, greedy accuracy on the
  256 test problems every 10 steps.
- ``w25m`` (b): the 25M Qwen2 (hidden 512, 8 layers) after 150 SFT steps on the ``explained`` word
  problems, answers ~100 tokens: 8 prompts x 8 samples, <= 128 new tokens, lr 1e-4, 8 steps, greedy
  accuracy on the 64 test problems every 4 steps.

Both: T = 1, lr constant, PPO-clip with one update per batch, no KL, the same reward function
(``math_verify``) and chat template. TRL trains the batch in one micro-batch with its defaults: bf16
(``--trl-fp32`` turns it off) and gradient checkpointing (``--trl-no-checkpointing`` turns it off: faster,
more memory). Trivium runs with what it chooses itself: ``trainer.precision: auto`` and micro-batches of
its token budget (``trainer.max_tokens_per_micro_batch``); ``--set KEY=VALUE`` adds overrides. Every run
is its own process; ``--repeats`` alternating (TRL, Trivium) pairs. The first step of every run is dropped.

Columns: median s/step; generated tokens per second of the whole step; the split of a step between
rollout (sampling and rewards), training and eval; peak RSS of the process; the greedy accuracy curve.
Timing needs a quiet machine: on a shared one the ratios are noise.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from grpo_overhead import DATA, QUICKSTART  # noqa: E402

# per workload: the defaults of the flags of the same names
WORKLOADS = {
    "quickstart": {
        "prompts": 16,
        "group": 8,
        "max_tokens": 24,
        "lr": 2e-4,
        "steps": 100,
        "eval_every": 10,
        "n_eval": 256,
    },
    "w25m": {
        "prompts": 8,
        "group": 8,
        "max_tokens": 128,
        "lr": 1e-4,
        "steps": 8,
        "eval_every": 4,
        "n_eval": 64,
    },
}


def workload_inputs(workload: str, work: Path, model: str | None) -> tuple[Path, Path]:
    """The workload's (SFT checkpoint, data folder with train.jsonl and test.jsonl); ``model`` None: the
    workload's own checkpoint, trained once into ``work``."""
    import engines

    if workload == "quickstart":
        data = DATA
        default = engines.quickstart_model
    else:
        data = engines.w25m_data(work)
        default = engines.w25m_model
    return (Path(model).resolve() if model else default(work)), data


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


# --- TRL ------------------------------------------------------------------------------------------------
def run_trl_inline(args) -> None:
    """One TRL run in this process; prints one JSON line per step and a last ``{"summary": ...}``."""
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, PrinterCallback
    from trl import GRPOTrainer
    from trl_side import clock, grpo_config

    from trivium.models.loading import load_tokenizer
    from trivium.rewards.registry import get_reward_fn

    torch.set_flush_denormal(True)
    torch.manual_seed(0)
    tok = load_tokenizer(args.model)
    tok.padding_side = "left"
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    reward = get_reward_fn("math_verify")
    train = _jsonl(args.data / "train.jsonl")[: args.steps * args.prompts]
    test = _jsonl(args.data / "test.jsonl")[: args.n_eval]

    def chat(q: str) -> list[dict]:
        return [{"role": "user", "content": q}]

    data = Dataset.from_list([{"prompt": chat(r["question"]), "answer": r["answer"]} for r in train])

    def exact(completions, answer, **_):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [reward(t, {"answer": a}).reward for t, a in zip(texts, answer)]

    @torch.no_grad()
    def evaluate() -> float:
        model.eval()
        right = 0
        for i in range(0, len(test), 64):
            rows = test[i : i + 64]
            texts = [
                tok.apply_chat_template(chat(r["question"]), tokenize=False, add_generation_prompt=True)
                for r in rows
            ]
            enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
            out = plain_generate(
                **enc, max_new_tokens=args.max_tokens, do_sample=False, pad_token_id=tok.pad_token_id
            )
            outs = tok.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
            right += sum(reward(o, {"answer": r["answer"]}).reward == 1 for o, r in zip(outs, rows))
        model.train()
        return right / len(test)

    def eval_row(step: int) -> dict:
        if step % args.eval_every and step != args.steps:
            return {}
        t0 = time.perf_counter()
        acc = evaluate()
        return {"eval_acc": acc, "eval_s": time.perf_counter() - t0}

    step_clock, plain_generate = clock(model, tok, eval_row)
    cfg = grpo_config(
        steps=args.steps,
        prompts=args.prompts,
        group=args.group,
        max_tokens=args.max_tokens,
        lr=args.lr,
        bf16=not args.trl_fp32,
        checkpointing=not args.trl_no_checkpointing,  # TRL's default: on (recomputes activations)
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=exact,
        args=cfg,
        train_dataset=data,
        processing_class=tok,
        callbacks=[step_clock],
    )
    trainer.remove_callback(PrinterCallback)
    trainer.train()
    print(json.dumps({"summary": {"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}}))


def run_trl(args, work: Path) -> dict:
    cmd = [sys.executable, __file__, "--side", "trl", "--model", str(args.model), "--data", str(args.data)]
    cmd += _shared_args(args)
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=work).stdout
    rows = [json.loads(x) for x in out.splitlines() if x.startswith("{")]
    steps = [r for r in rows if "step_s" in r]
    return {
        "steps": steps[1:],
        "curve": [(r["step"], r["eval_acc"]) for r in steps if "eval_acc" in r],
        "peak_rss_mb": rows[-1]["summary"]["peak_rss_mb"],
        "split": {
            "rollout": [r["rollout_s"] for r in steps[1:]],
            "train": [r["step_s"] - r["rollout_s"] - r.get("eval_s", 0.0) for r in steps[1:]],
            "eval": [r.get("eval_s", 0.0) for r in steps[1:]],
        },
    }


# --- Trivium --------------------------------------------------------------------------------------------
def run_trivium(args, work: Path, tag: str) -> dict:
    cfg = yaml.safe_load(QUICKSTART.read_text())
    grpo = cfg["stages"][1]
    cfg.update(
        project="bench", name=f"vs-trl-{tag}", checkpoint_root=str(work), monitor={"progress_bar": False}
    )
    cfg["model"] = {"path": str(args.model)}
    grpo["buffer"].update(total_steps=args.steps, batch_size=args.prompts)
    grpo["buffer"]["taskset"].update(
        shuffle=False, repeat_times=args.group, path=str(args.data / "train.jsonl")
    )
    grpo["trainer"].update(lr=args.lr, micro_batch_size=args.prompts * args.group)
    grpo.setdefault("explorer", {}).update(eval_interval=args.eval_every, eval_at_start=False)
    cfg["explorer"]["rollout"]["max_tokens"] = args.max_tokens
    test = args.data / "test.jsonl"
    if args.n_eval < len(_jsonl(test)):  # the first n_eval problems, as TRL's side evaluates
        small = work / f"test_{args.n_eval}.jsonl"
        small.write_text("".join(json.dumps(r) + "\n" for r in _jsonl(test)[: args.n_eval]))
        test = small
    cfg["buffer"]["eval_tasksets"] = [{"path": str(test), "name": "test"}]
    cfg["stages"] = [grpo]
    path = work / f"vs-trl-{tag}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    sets = [x for kv in args.overrides for x in ("--set", kv)]
    cmd = [sys.executable, "-m", "trivium.cli", "run", "-c", str(path), "--overwrite", *sets]
    subprocess.run(cmd, check=True, capture_output=True)
    rows = [r for r in _jsonl(work / "bench" / f"vs-trl-{tag}" / "metrics.jsonl") if "time/step" in r]
    steps = [
        {"step_s": r["time/step"], "tokens": r.get("rollout/response_tokens", 0.0), **r} for r in rows[1:]
    ]
    return {
        "steps": steps,
        "curve": [(r["step"], r["eval/test/accuracy"]) for r in rows if "eval/test/accuracy" in r],
        "peak_rss_mb": max(r.get("train/peak_rss_mb", 0.0) for r in rows),
        "split": {
            "rollout": [r.get("time/rollout", 0.0) for r in steps],
            "train": [r.get("time/train", 0.0) for r in steps],
            "eval": [r.get("time/eval", 0.0) for r in steps],
        },
    }


# --- the table ------------------------------------------------------------------------------------------
def row(name: str, runs: list[dict]) -> tuple[str, float, float]:
    steps = [s for r in runs for s in r["steps"]]
    s_step = statistics.median(s["step_s"] for s in steps)
    tok_s = sum(s["tokens"] for s in steps) / sum(s["step_s"] for s in steps)
    split = {k: statistics.mean(x for r in runs for x in r["split"][k]) for k in ("rollout", "train", "eval")}
    whole = sum(split.values()) or 1.0
    split_text = " / ".join(f"{100 * v / whole:.0f}%" for v in split.values())
    rss = max(r["peak_rss_mb"] for r in runs)
    curve = " ".join(f"{acc:.3f}" for _, acc in runs[-1]["curve"])
    return f"| {name} | {s_step:.3f} | {tok_s:.0f} | {split_text} | {rss:.0f} | {curve} |", s_step, tok_s


def _shared_args(args) -> list[str]:
    out = ["--steps", str(args.steps), "--eval-every", str(args.eval_every), "--n-eval", str(args.n_eval)]
    out += ["--prompts", str(args.prompts), "--group", str(args.group), "--lr", str(args.lr)]
    out += ["--max-tokens", str(args.max_tokens)] + (["--trl-fp32"] if args.trl_fp32 else [])
    return out + (["--trl-no-checkpointing"] if args.trl_no_checkpointing else [])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", choices=list(WORKLOADS), default="quickstart")
    ap.add_argument("--model", help="the SFT checkpoint both start from (default: the workload's, made once)")
    ap.add_argument("--work", default=str(REPO / "benchmarks" / "workdir"), help="models and data (reused)")
    ap.add_argument("--steps", type=int)
    ap.add_argument("--eval-every", type=int)
    ap.add_argument("--n-eval", type=int, help="test problems evaluated (default: all)")
    ap.add_argument("--prompts", type=int)
    ap.add_argument("--group", type=int)
    ap.add_argument("--lr", type=float)
    ap.add_argument("--max-tokens", type=int)
    ap.add_argument("--data", help=argparse.SUPPRESS)  # TRL's side: the workload's data folder
    ap.add_argument("--repeats", type=int, default=1, help="alternating (TRL, Trivium) pairs")
    ap.add_argument("--trl-fp32", action="store_true", help="TRL without bf16 (its default here is bf16)")
    ap.add_argument(
        "--trl-no-checkpointing",
        action="store_true",
        help="TRL without gradient checkpointing (its default is on: less memory, ~30%% more training compute)",
    )
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--side", choices=["trl"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    for key, value in WORKLOADS[args.workload].items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.side == "trl":
        args.model, args.data = Path(args.model), Path(args.data)
        run_trl_inline(args)
        return 0
    args.model, args.data = workload_inputs(args.workload, Path(args.work).resolve(), args.model)
    work = Path(tempfile.mkdtemp(prefix="trivium-vs-trl-"))
    trl_runs, tri_runs = [], []
    for r in range(args.repeats):
        trl_runs.append(run_trl(args, work))
        tri_runs.append(run_trivium(args, work, str(r)))
        print(f"pair {r + 1} done", file=sys.stderr, flush=True)
    trl_name = "TRL GRPOTrainer" + (" fp32" if args.trl_fp32 else " bf16")
    trl_name += (
        ", no gradient checkpointing"
        if args.trl_no_checkpointing
        else " (gradient checkpointing: its default)"
    )
    tri_name = "trivium run" + (f" ({', '.join(args.overrides)})" if args.overrides else " (its own choice)")
    print(
        f"workload {args.workload}: {args.prompts} prompts x {args.group}, <= {args.max_tokens} new tokens, "
        f"lr {args.lr}, {args.steps} steps, eval every {args.eval_every} on {args.n_eval} test problems\n"
    )
    print(
        "| run | s/step (median) | generated tok/s | rollout / train / eval | peak RSS MB | greedy accuracy |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    line, trl_s, trl_tok = row(trl_name, trl_runs)
    print(line)
    line, tri_s, tri_tok = row(tri_name, tri_runs)
    print(line)
    print(f"\nTrivium / TRL s/step: {tri_s / trl_s:.2f} (target <= 0.5); tokens/s: {tri_tok / trl_tok:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
