#!/usr/bin/env bash
# Every GPU check in one go, most important first, each under a time limit taken from one budget:
#   1. build the gpu preset (background) while the CUDA tests run (`pytest -m gpu` + static steps);
#   2. bench rollout, default workload (8 tasks x 4 samples per env, batch 32): off, eager, srt, useless
#      (its JSON has each configuration's start-up capture apart: engine_start_s, warm_up_capture_s,
#      and what was still captured mid-run: graph_capture_s, unwarmed_shapes; ms per decode step,
#      verify step and prefill with their device share; then one untimed round of off and srt
#      under torch.profiler: rollout_profile/{off,srt}.txt);
#   3. perfect and useless drafts against plain decoding on the same model (spec_engine_micro.py) at
#      batch 1, 32 and 128: what one verify step costs against one decode step, host and device;
#   4. GRPO training on the GPU (configs/gpu.yaml);
#   5. bench rollout at an RL batch (16 x 8 per env, batch 128, configs/gpu.yaml's spec): off, srt;
#   6. bench engine on a random Qwen2.5-0.5B-shaped checkpoint at batch 1 and 64 (graphs vs eager);
#   7. build the gpu-0.5b preset (Qwen2.5-0.5B's shape, bfloat16 SFT) and bench rollout on it: off, srt;
#   8. (only when named in STAGES) retail: build the retail-gpu preset, sample 20 held-out transcripts
#      (garbled turns), train configs/retail-gpu.yaml
#      (constrained calls: masked CUDA graphs) and bench rollout on Retail with the built model: off, srt.
# A stage that fails or runs out of time does not stop the later ones; every stage's log is kept.
#
# Usage, from the repository root of a CUDA machine where srt-agent's dependencies are importable
# (an image with torch alone lacks gymnasium, pydantic, bm25s, starlette, uvicorn and tenacity: bring
# their wheels, which `bash benchmarks/gpu_wheels.sh` downloads, and `pip install --no-deps --target DIR` them
# onto PYTHONPATH first); the script
# installs srt-agent itself (`pip install -e .`, offline) when it is not installed:
#   bash benchmarks/gpu_check.sh OUT_DIR [BUDGET_S] [TRAIN_STEPS] [TRAIN_TIME_S]
# Training stops starting steps after TRAIN_TIME_S (default 120), then evaluates as after its last step.
# Writes OUT_DIR/log.txt (every stage's output) and
# OUT_DIR/{build,bench32,micro,train,bench128,engine,build05,bench05}.json (and, with the retail stage,
# build_retail, retail_sampled, retail and bench_retail.json).
# STAGES="tests bench32 ..." runs those stages only (default: all); TESTS="-k expr" narrows the tests;
# BENCH32_CONFIGS overrides the first benchmark's configurations. MODEL=DIR skips the build and uses DIR; DEVICE=cpu runs the same commands on a CPU (a dry run
# for the script itself, with a small MODEL, SHAPE=embedded and BENCH_ARGS="--rounds 1 ..."); NATIVE_BUILD=0
# skips compiling the native core (where the installed one is already importable).
set -uo pipefail
out=${1:?usage: gpu_check.sh OUT_DIR [BUDGET_S] [TRAIN_STEPS] [TRAIN_TIME_S]}
budget=${2:-560}
train_steps=${3:-30}
train_time=${4:-120}
device=${DEVICE:-cuda}
model=${MODEL:-runs/gpu-model}
py=${PYTHON:-python3}
stages=" ${STAGES:-tests bench32 micro train bench128 engine big} "
read -r -a test_args <<<"${TESTS:-}"
shape=${SHAPE:-qwen2.5-0.5b}
# Extra arguments of every bench rollout (a dry run shrinks the workload with them).
read -r -a bench_args <<<"${BENCH_ARGS:-}"
# Extra overrides of the training run (e.g. TRAIN_ARGS="optim.lr=3e-5").
read -r -a train_args <<<"${TRAIN_ARGS:-}"
mkdir -p "$out"
log="$out/log.txt"
start=$(date +%s)
left() { echo $((budget - ($(date +%s) - start))); }

# stage NAME LIMIT_S CMD...: run CMD under min(LIMIT_S, what is left), appending its output to the log.
stage() {
    local name=$1 limit=$2 remaining t0 rc
    shift 2
    [[ $stages == *" $name "* ]] || return 0
    remaining=$(left)
    if ((remaining < 15)); then
        echo "=== $name: skipped, ${remaining}s left" | tee -a "$log"
        return
    fi
    ((limit > remaining)) && limit=$remaining
    echo "=== $name (limit ${limit}s, $(date +%T))" | tee -a "$log"
    t0=$(date +%s)
    PYTHONUNBUFFERED=1 timeout "$limit" "$@" >>"$log" 2>&1
    rc=$?
    echo "=== $name: rc=$rc in $(($(date +%s) - t0))s" | tee -a "$log"
}

{
    echo "gpu_check $(date -u +%FT%TZ) device=$device budget=${budget}s"
    $py -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available() and torch.cuda.get_device_name())"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null
} >>"$log" 2>&1

# srt-agent's dependencies: name the missing ones at once (a bare image has torch alone), so a call
# that cannot run says why in its first lines instead of in every stage's traceback.
missing=$("$py" - <<'PY' 2>/dev/null
import importlib.util
names = ("gymnasium", "pydantic", "httpx", "yaml", "typer", "rich", "numpy", "bm25s", "matplotlib",
         "starlette", "uvicorn", "tenacity", "transformers")
print(" ".join(n for n in names if importlib.util.find_spec(n) is None))
PY
)
if [[ -n $missing ]]; then
    echo "=== missing dependencies: $missing (carry their wheels: see this script's header)" | tee -a "$log"
fi

# The built-in envs and tools live in envs/ and tools/ and are importable as srt_agent.envs /
# srt_agent.tools only once the package is installed (pyproject's package-dir): on a bare machine,
# install it in place, offline, without its dependencies (those must already be importable).
if ! "$py" -c "import srt_agent.envs" >/dev/null 2>&1; then
    echo "=== install: pip install -e . ($(date +%T))" | tee -a "$log"
    "$py" -m pip install -q --no-deps --no-build-isolation --no-index -e . >>"$log" 2>&1
    "$py" -c "import srt_agent.envs" >>"$log" 2>&1 || echo "=== install: srt_agent.envs NOT importable" | tee -a "$log"
fi

# The native core (srt_agent._native), compiled here for this machine's Python if it can be (needs
# pybind11 importable and Python's headers); without it the engine runs its Python twins.
if [[ -f setup.py && ${NATIVE_BUILD:-1} != 0 ]]; then
    echo "=== native: build ($(date +%T))" | tee -a "$log"
    if "$py" setup.py -q build_ext --inplace >>"$log" 2>&1 && "$py" -c "import srt_agent._native" >>"$log" 2>&1; then
        echo "=== native: built" | tee -a "$log"
    else
        echo "=== native: NOT built (the Python path runs)" | tee -a "$log"
    fi
fi

cli=("$py" -m srt_agent.cli)
build_pid=""
if [[ -z ${MODEL:-} ]]; then
    echo "=== build: background ($(date +%T))" | tee -a "$log"
    PYTHONUNBUFFERED=1 timeout "$budget" "${cli[@]}" build-model --preset gpu --out "$model" \
        --json "$out/build.json" >"$out/build.log" 2>&1 &
    build_pid=$!
fi
if [[ $device == cuda ]]; then
    stage tests 130 "$py" -m pytest -v -m "gpu or not gpu" -p no:cacheprovider \
        tests/test_gpu_engine.py tests/test_engine_static_steps.py "${test_args[@]}"
fi
if [[ -n $build_pid ]]; then
    wait "$build_pid"
    echo "=== build: rc=$? at $(date +%T)" | tee -a "$log"
    tail -n 25 "$out/build.log" >>"$log"
    rm -f "$out/build.log"  # (its tail is in the log: fewer files to bring back)
fi

stage bench32 130 "${cli[@]}" bench rollout --model "$model" --device "$device" \
    --configs "${BENCH32_CONFIGS:-off,eager,srt,useless}" --json "$out/bench32.json" \
    --profile "$out/rollout_profile" "${bench_args[@]}"
stage micro 90 env PYTHONPATH=".${PYTHONPATH:+:$PYTHONPATH}" "$py" benchmarks/spec_engine_micro.py --model "$model" --device "$device" \
    --batch-sizes 1 32 128 --new-tokens 128 --repeats 2 --profile "$out/profile" --json "$out/micro.json"
stage train $((train_time + 100)) "${cli[@]}" train configs/gpu.yaml "model.dir=$model" "trainer.device=$device" \
    "trainer.steps=$train_steps" "trainer.time_limit_s=$train_time" trainer.out_dir=runs/gpu-check-train \
    "${train_args[@]}" --json "$out/train.json"
stage bench128 100 "${cli[@]}" bench rollout --model "$model" --device "$device" \
    --prompts 16 --samples 8 --batch 128 --rounds "${BENCH128_ROUNDS:-3}" --configs off,srt --config configs/gpu.yaml \
    --json "$out/bench128.json" "${bench_args[@]}"
stage engine 70 "${cli[@]}" bench engine --shape "$shape" --device "$device" --batch-sizes 1,64 \
    --no-hf --json "$out/engine.json"
# The realistic-size policy: its build (timed, with its SFT rate) and SRT's ratio on it.
big=${BIG_MODEL:-runs/gpu-0.5b-model}
if [[ -z ${BIG_MODEL:-} ]]; then
    stage big 280 "${cli[@]}" build-model --preset "${BIG_PRESET:-gpu-0.5b}" --out "$big" --force --json "$out/build05.json"
fi
stage big 150 "${cli[@]}" bench rollout --model "$big" --device "$device" --configs off,srt \
    --rounds "${BIG_ROUNDS:-3}" --json "$out/bench05.json" "${bench_args[@]}"
# The dialogue benchmark (not in the default stages: STAGES="retail" or add it): build the retail-gpu
# preset, then GRPO with configs/retail-gpu.yaml, held-out pass^1 before and after in retail.json.
retail=${RETAIL_MODEL:-runs/retail-gpu-model}
if [[ -z ${RETAIL_MODEL:-} ]]; then
    stage retail 240 "${cli[@]}" build-model --preset retail-gpu --out "$retail" --force --json "$out/build_retail.json"
fi
# The built model's turns: 20 sampled held-out transcripts, every assistant turn parsed as a
# well-formed tool call or plain text (retail_sampled.json's garbled_turns; the trace keeps the turns).
stage retail 60 "${cli[@]}" eval --env srt/Retail-v0 --model "$retail" --device "$device" --episodes 20 \
    --temperature 1 --constrain-tool-calls --copy-tool-arguments --json "$out/retail_sampled.json" \
    --trace "$out/retail_sampled.jsonl"
stage retail 330 "${cli[@]}" train configs/retail-gpu.yaml "model.dir=$retail" "trainer.device=$device" \
    "trainer.time_limit_s=${RETAIL_TIME:-240}" trainer.out_dir=runs/gpu-check-retail --json "$out/retail.json"
stage retail 120 "${cli[@]}" bench rollout --model "$retail" --device "$device" --env srt/Retail-v0 \
    --configs off,srt --json "$out/bench_retail.json" "${bench_args[@]}"
echo "gpu_check done in $(($(date +%s) - start))s" | tee -a "$log"
