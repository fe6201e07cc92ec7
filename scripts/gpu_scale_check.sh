#!/usr/bin/env bash
# The multi-rank trainer on CUDA with NCCL: the parity runs of tests/trainer/test_parallel_parity.py on GPUs
# (rank r on cuda:r), then benchmarks/scale.py's layout part. A few minutes on one machine with GPUs.
#
#   bash scripts/gpu_scale_check.sh OUT_DIR
#
# With one GPU, NCCL cannot put two ranks on it: strategies ddp and fsdp2 run with one rank (world size 1
# still goes through DDP / fully_shard and NCCL), several ranks need as many GPUs.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-gpu-check}
mkdir -p "$OUT"
GPUS=$(python -c "import torch; print(torch.cuda.device_count())")
echo "GPUs: $GPUS"; nvidia-smi --query-gpu=name,memory.total --format=csv | tee "$OUT/gpus.csv"
MODEL="$OUT/tiny"
trivium make-tiny "$MODEL" --hidden-size 64 --num-layers 2 --num-heads 4 --num-kv-heads 2 --intermediate-size 128 --vocab-size 300
export TRIVIUM_PARITY_DEVICE=cuda
WORLD=$(( GPUS >= 2 ? 2 : 1 ))
port() { python -c "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])"; }
for lora in "" lora; do
  python tests/trainer/parity_worker.py "$MODEL" "$OUT/single$lora.pt" single 0 1 "tcp://127.0.0.1:$(port)" "$lora"
  for strategy in ddp fsdp2; do
    init="tcp://127.0.0.1:$(port)"
    for ((r = 0; r < WORLD; r++)); do
      python tests/trainer/parity_worker.py "$MODEL" "$OUT/$strategy$lora.pt" "$strategy" "$r" "$WORLD" "$init" "$lora" &
    done
    wait
  done
done
python - "$OUT" <<'PY'
import sys, torch
out = sys.argv[1]
for lora in ("", "lora"):
    ref = torch.load(f"{out}/single{lora}.pt", weights_only=False)
    for strategy in ("ddp", "fsdp2"):
        got = torch.load(f"{out}/{strategy}{lora}.pt", weights_only=False)
        for scenario in ref:
            loss = max(abs(a["train/loss"] - b["train/loss"]) / max(1e-8, abs(a["train/loss"])) for a, b in zip(ref[scenario]["steps"], got[scenario]["steps"]))
            gap = max(float((got[scenario]["weights"][k] - w).abs().max()) for k, w in ref[scenario]["weights"].items())
            print(f"{strategy:6} {lora or 'full':5} {scenario:22} max loss rel diff {loss:.2e}  max weight diff {gap:.2e}")
PY
python benchmarks/scale.py --parts layout --steps 3 --device cuda | tee "$OUT/scale_layout.txt"
