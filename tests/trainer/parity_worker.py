"""One rank of the parity runs (tests/trainer/test_parallel_parity.py): the same trainer steps on the same
data under trainer.strategy single, ddp or fsdp2; rank 0 writes every step's loss and grad norm and the
final weights.

    python tests/trainer/parity_worker.py MODEL_DIR OUT STRATEGY RANK WORLD INIT [LORA]

TRIVIUM_PARITY_DEVICE=cuda runs rank r on cuda:r with NCCL (scripts/gpu_scale_check.sh);
TRIVIUM_PARITY_PRECISION (default fp32) sets trainer.precision; TRIVIUM_PARITY_COMPILE=1 turns trainer.compile
on and TRIVIUM_PARITY_STATE_DTYPE sets trainer.optimizer_state_dtype (checks by hand: the compiled layers under
ddp and fsdp2, bf16 moments under ddp); TRIVIUM_PARITY_RECOMPUTE=1 turns trainer.gradient_checkpointing on.
"""

import datetime
import os
import sys

import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM

from trivium.config.schema import AlgorithmConfig, KLLossConfig, LoraConfig, TrainerConfig
from trivium.launch.ranks import end_rank_process, leave_process_group
from trivium.models import lora
from trivium.trainer.parallel import make_parallel
from trivium.trainer.recompute import recomputes
from trivium.trainer.spec import AlgorithmSpec
from trivium.trainer.trainer import Trainer
from trivium.types import Experience

STEPS = 5
# (name, algorithm, trainer settings): one update per batch; mini-batches x epochs with a KL loss; SFT
SCENARIOS = [
    ("grpo", AlgorithmConfig(algorithm_type="grpo"), {"micro_batch_size": 3}),
    (
        "grpo_minibatches_kl",
        AlgorithmConfig(algorithm_type="grpo", kl_loss=KLLossConfig(coef=0.1)),
        {"micro_batch_size": 2, "mini_batch_size": 8, "ppo_epochs": 2},
    ),
    ("sft", AlgorithmConfig(algorithm_type="sft"), {"micro_batch_size": 5}),
]


def batch(seed: int, vocab: int) -> list[Experience]:
    """16 sequences (4 groups of 4) of 6-14 tokens with varied rewards, the same on every rank."""
    g = torch.Generator().manual_seed(1000 + seed)
    out = []
    for i in range(16):
        n = int(torch.randint(6, 15, (1,), generator=g))
        prompt = int(torch.randint(2, 5, (1,), generator=g))
        tokens = torch.randint(4, vocab, (n,), generator=g)
        out.append(
            Experience(
                tokens=tokens,
                prompt_length=prompt,
                action_mask=torch.ones(n - prompt, dtype=torch.bool),
                logprobs=-torch.rand(n - prompt, generator=g) * 3,
                reward=float(torch.rand(1, generator=g)),
                group_id=i // 4,
                run_index=i % 4,
            )
        )
    return out


def main(model_dir, out, strategy, rank, world, init, use_lora=""):
    rank, world = int(rank), int(world)
    cuda = os.environ.get("TRIVIUM_PARITY_DEVICE") == "cuda"
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 parity
        torch.backends.cudnn.allow_tf32 = False
    if world > 1 or (cuda and strategy != "single"):
        dist.init_process_group(
            "nccl" if cuda else "gloo",
            init_method=init,
            rank=rank,
            world_size=world,
            timeout=datetime.timedelta(seconds=120),
        )
    results = {}
    for name, algorithm, settings in SCENARIOS:
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device)
        if use_lora:
            model = lora.attach(model, LoraConfig(rank=4, alpha=8, target_modules="all-linear"))
            with torch.no_grad():  # B starts at 0: make the adapters matter from the first step
                for n, p in model.named_parameters():
                    if "lora_B" in n:
                        p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(len(n))) * 0.01)
        spec = AlgorithmSpec.from_config(algorithm)
        ref = None
        if spec.kl_coef > 0 and not use_lora:
            ref = (
                AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
                .eval()
                .requires_grad_(False)
            )
        trainer = Trainer(
            model,
            TrainerConfig(
                lr=1e-3,
                precision=os.environ.get("TRIVIUM_PARITY_PRECISION", "fp32"),
                compile=os.environ.get("TRIVIUM_PARITY_COMPILE") == "1",
                optimizer_state_dtype=os.environ.get("TRIVIUM_PARITY_STATE_DTYPE", "float32"),
                gradient_checkpointing=os.environ.get("TRIVIUM_PARITY_RECOMPUTE") == "1",
                **settings,
            ),
            spec,
            pad_token_id=0,
            total_steps=STEPS,
            max_response_length=12,
            ref_model=ref,
            reference_is_base=bool(use_lora) and spec.kl_coef > 0,
            parallel=make_parallel(strategy, device, rank, world),
        )
        data = batch(0, model.config.vocab_size)  # the same batch every step: its loss must fall
        steps = []
        for _ in range(STEPS):
            m = trainer.train_step(data)
            steps.append({k: m[k] for k in ("train/loss", "train/grad_norm", "loss/policy")})
        weights = {k: v.cpu() for k, v in trainer.export_weights().items()}
        results[name] = {"steps": steps, "weights": weights, "recomputes": recomputes(model)}
    if rank == 0:
        torch.save(results, out)
    del trainer, model, ref  # garbage for leave_process_group's collection, as in a real rank's exit
    leave_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:])
    end_rank_process(0)  # as trivium.launch.rank ends: no interpreter teardown of collective state
