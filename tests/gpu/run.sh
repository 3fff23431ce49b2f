#!/usr/bin/env bash
# The device runbook: one step per call of the device tool (each under 8 minutes), results in
# $OUT/results.md (a table, printed last) and the step's log in $OUT/<step>.log. In order:
#   unpack    (carry .gpu/a) the binaries and the model's first part into /tmp/lmi
#   tests     (carry .gpu/b) the model assembled and checked; (1) every CUDA test binary with
#             real launches only (LMI_TEST_DEVICE_ONLY=1, LMI_REQUIRE_GPU=1), the NVRTC check
#   sanitize  (2) compute-sanitizer: memcheck and initcheck over the test binaries, racecheck on
#             attention, the sampler and the delta rule, synccheck
#   agree     (3) CPU vs CUDA on the default model's real weights (greedy 32 tokens on >= 95%
#             of prompts, logprobs within 0.1, a seeded request identical run after run); a request served
#             by `lmi serve --device cuda`
#   bench     (4) the ceilings, then `lmi bench engine --device cuda` on the default model, a
#             4-layer and a full 8B-shaped random model (made here), and the 8B shape again
#             with the down projection unfused (LMI_CUDA_FUSED_DOWN_ROWS=0)
#   hf        (5) HF transformers generate() on the same shapes
# `run.sh --fake STEP` runs a step on this machine's fake driver (tests/gpu/fake-driver.sh),
# from .gpu/bin (tests/gpu/stage.sh): the rehearsal, small shapes; what this machine lacks
# (compute-sanitizer, torch) is skipped with a line saying so.
set -uo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD

fake=0
if [ "${1:-}" = "--fake" ]; then
    fake=1
    shift
fi
step=${1:?usage: run.sh [--fake] unpack|tests|sanitize|agree|bench|hf}

if [ $fake = 1 ]; then
    WORK=$ROOT/target/gpu-rehearsal
    BIN=$ROOT/.gpu/bin
    MODEL=$(ls "${LMI_MODEL_CACHE:-$HOME/.cache/lmi/models}"/SmolLM2-135M-Instruct*.gguf | head -1)
    LMI_CUDA_LIB_DIR=$(tests/gpu/fake-driver.sh) || exit 1
    export LMI_CUDA_LIB_DIR
else
    WORK=/tmp/lmi
    BIN=$WORK/bin
    MODEL=$WORK/model.gguf
    export LMI_REQUIRE_GPU=1
fi
export LMI_TEST_DEVICE_ONLY=1 LMI_REQUIRE_NVRTC=1
OUT=${OUT:-$WORK/out}
mkdir -p "$WORK" "$OUT"
LOG=$OUT/$step.log
: >"$LOG"
[ -s "$OUT/results.md" ] || {
    echo "| step | check | result | seconds |"
    echo "|---|---|---|---:|"
} >"$OUT/results.md"

row() { echo "| $step | $1 | $2 | $3 |" | tee -a "$OUT/results.md"; }

# check NAME SUMMARY_REGEX COMMAND...: runs it (output to the log), records pass or the exit
# code with the last line matching SUMMARY_REGEX.
check() {
    local name=$1 summary=$2
    shift 2
    local t0=$SECONDS rc
    echo "== $name: $*" >>"$LOG"
    "$@" >>"$LOG.part" 2>&1
    rc=$?
    cat "$LOG.part" >>"$LOG"
    local said
    said=$(grep -E "$summary" "$LOG.part" | tail -1 | tr '|' '/' | cut -c1-160)
    rm -f "$LOG.part"
    if [ $rc = 0 ]; then row "$name" "pass ${said}" $((SECONDS - t0)); else row "$name" "FAIL (exit $rc) ${said}" $((SECONDS - t0)); fi
    return $rc
}

skip() { row "$1" "skipped: $2" 0; }

need_model() {
    [ -f "$MODEL" ] && return 0
    if [ -f .gpu/b/model.01 ] && [ -f "$WORK/model.00" ]; then
        cat "$WORK/model.00" .gpu/b/model.01 >"$MODEL"
        [ "$(sha256sum <"$MODEL" | cut -d' ' -f1)" = "$(cat "$WORK/model.sha256")" ] ||
            { row model "FAIL: the assembled model's sha256 differs" 0; rm -f "$MODEL"; return 1; }
        return 0
    fi
    row model "FAIL: no model (carry .gpu/a with 'unpack', then .gpu/b)" 0
    return 1
}

# A converted HF directory of the default model (bf16), for the agreement test and HF.
need_hf_model() {
    [ -f "$WORK/smollm2/config.json" ] ||
        "$BIN/lmi" convert "$MODEL" "$WORK/smollm2" --dtype bf16 >>"$LOG" 2>&1
}

tests_with() { for t in cuda_ops cuda_attention cuda_sampling cuda_engine cuda_qwen_vl cuda_gemma3 cuda_moe cuda_delta_net cuda_hybrid; do [ -x "$BIN/$t" ] && echo "$t"; done; }

case $step in
unpack)
    mkdir -p "$BIN"
    check unpack "binaries" sh -c "xz -dc .gpu/a/bin.tar.xz | tar -C '$BIN' -xf - && cp .gpu/a/model.00 .gpu/a/model.sha256 '$WORK/' && ls -la '$BIN' && echo \$(ls '$BIN' | wc -l) binaries: \$(ls '$BIN' | tr '\n' ' ')"
    nvidia-smi -L >>"$LOG" 2>&1 && row gpu "$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | head -1)" 0
    check "python, NVRTC and cuBLAS wheels" "nvidia-cu" python3 -c 'import importlib.metadata as m; print(" ".join(d.metadata["Name"]+"=="+d.version for d in m.distributions() if d.metadata["Name"] in ("torch","transformers","nvidia-cuda-nvrtc","nvidia-cublas")))'
    ;;
tests)
    need_model
    for t in $(tests_with); do
        check "$t" "test result" "$BIN/$t" --test-threads=1
    done
    # With the machine's own NVRTC (the CI's second, oldest one is not here).
    check nvrtc_compile "NVRTC 1[0-9]\.[0-9]+ \(|test result" "$BIN/nvrtc_compile" --test-threads=1 --nocapture \
        --skip every_kernel_compiles_without_spills_on_the_oldest_nvrtc_too
    ;;
sanitize)
    if ! command -v compute-sanitizer >/dev/null; then
        skip compute-sanitizer "not installed here"
    else
        cs() { timeout "$1" compute-sanitizer --error-exitcode 99 --print-limit 20 "${@:2}"; }
        for t in cuda_ops cuda_attention cuda_engine cuda_delta_net; do
            check "memcheck $t" "ERROR SUMMARY|test result" cs 100 --tool memcheck "$BIN/$t" --test-threads=1
        done
        check "memcheck cuda_sampling (128k, masks, ties)" "ERROR SUMMARY|test result" \
            cs 90 --tool memcheck "$BIN/cuda_sampling" --test-threads=1 a_128k masked ties
        check "initcheck cuda_ops, cuda_engine" "ERROR SUMMARY|test result" \
            sh -c "timeout 60 compute-sanitizer --error-exitcode 99 --tool initcheck '$BIN/cuda_ops' --test-threads=1 && timeout 90 compute-sanitizer --error-exitcode 99 --tool initcheck '$BIN/cuda_engine' --test-threads=1 llama_qwen2"
        check "racecheck attention" "RACECHECK SUMMARY|ERROR SUMMARY|test result" \
            cs 60 --tool racecheck "$BIN/cuda_attention" --test-threads=1 decode_contexts tensor_core_tiling
        check "racecheck sampler" "RACECHECK SUMMARY|ERROR SUMMARY|test result" \
            cs 60 --tool racecheck "$BIN/cuda_sampling" --test-threads=1 greedy masked_draws_match
        # The delta rule's shared-memory staging and cross-warp sums (kernels/delta_net.cu).
        check "racecheck delta_net" "RACECHECK SUMMARY|ERROR SUMMARY|test result" \
            cs 60 --tool racecheck "$BIN/cuda_delta_net" --test-threads=1 gated_delta_net
        check "synccheck attention" "ERROR SUMMARY|test result" \
            cs 30 --tool synccheck "$BIN/cuda_attention" --test-threads=1 split_contexts
    fi
    ;;
agree)
    need_model && need_hf_model
    # Fewer prompts on the fake driver: it emulates every launch.
    prompts=20
    [ $fake = 1 ] && prompts=2
    check "CPU vs CUDA, default model, 32 greedy tokens" "prompts agree|seeded|test result" \
        env LMI_GPU_AGREEMENT_MODEL="$WORK/smollm2" LMI_GPU_AGREEMENT_PROMPTS=$prompts \
        "$BIN/cuda_engine" --exact real_checkpoint_agrees_with_the_cpu_engine_on_a_gpu --nocapture
    small=()
    [ $fake = 1 ] && small=(-o option.max_rolling_batch_size=4 -o option.max_rolling_batch_prefill_tokens=64 -o option.max_model_len=512)
    port=18700
    "$BIN/lmi" serve --device cuda --model "$MODEL" --port $port "${small[@]}" >>"$LOG" 2>&1 &
    pid=$!
    t0=$SECONDS
    until curl -fsS "localhost:$port/ping" >/dev/null 2>&1; do
        kill -0 $pid 2>/dev/null || break
        [ $((SECONDS - t0)) -gt 300 ] && break
        sleep 1
    done
    reply=$(curl -fsS "localhost:$port/generate" -d '{"inputs": "The capital of France is", "parameters": {"max_new_tokens": 16, "do_sample": false}}' 2>>"$LOG")
    echo "$reply" >>"$LOG"
    graphs=$(curl -fsS "localhost:$port/metrics" 2>/dev/null | grep '^lmi_cuda_graphs' | tr '\n' ' ')
    if echo "$reply" | grep -q '"generated_text"'; then
        row "lmi serve --device cuda" "pass, ready in $((SECONDS - t0)) s: $(echo "$reply" | cut -c1-80) $graphs" $((SECONDS - t0))
    else
        row "lmi serve --device cuda" "FAIL: no answer (see the log)" $((SECONDS - t0))
    fi
    kill $pid 2>/dev/null
    wait $pid 2>/dev/null
    ;;
bench)
    need_model
    if [ $fake = 1 ]; then
        small=(--ceiling-sizes 8,128)
        shape=(--shape tiny) batches=(--batch 1,4 --prompt-len 16 --decode-steps 4 "${small[@]}")
        default_batches=(--batch 1,2 --prompt-len 16 --decode-steps 2 "${small[@]}")
    else
        shape=() batches=() default_batches=()
    fi
    check "lmi bench engine: default model (ceilings first)" "roofline|bandwidth|^\| 1 \|" \
        "$BIN/lmi" bench engine --device cuda --model "$MODEL" "${default_batches[@]}"
    for layers in 4 32; do
        dir=$WORK/llama8b-$layers
        [ -f "$dir/config.json" ] || python3 tests/gpu/make_random_llama.py "$dir" --layers $layers "${shape[@]}" >>"$LOG" 2>&1
        check "lmi bench engine: 8B-shaped, $layers layers" "roofline|^\| 1 \|" \
            "$BIN/lmi" bench engine --device cuda --model "$dir" "${batches[@]}"
    done
    # The down projection's fused SwiGLU + GEMV (kernels/mlp_down.cu, steps of <= 8 rows)
    # against silu_mul then cuBLAS, on the full 8B shape: which to keep is decided here.
    if [ $fake = 1 ]; then ab=(--batch 1 --prompt-len 16 --decode-steps 4 "${small[@]}"); else ab=(--batch 1,8); fi
    check "lmi bench engine: 8B-shaped, 32 layers, down projection unfused" "roofline|^\| 1 \|" \
        env LMI_CUDA_FUSED_DOWN_ROWS=0 "$BIN/lmi" bench engine --device cuda --model "$WORK/llama8b-32" "${ab[@]}"
    grep -E "^\|" "$LOG" >"$OUT/bench-tables.md"
    ;;
hf)
    if ! python3 -c 'import torch, transformers' 2>/dev/null; then
        skip "transformers generate()" "no torch and transformers here"
    else
        for dir in "$WORK/smollm2" "$WORK/llama8b-4" "$WORK/llama8b-32"; do
            [ -f "$dir/config.json" ] || { skip "transformers $(basename "$dir")" "not made yet (bench, agree)"; continue; }
            check "transformers generate(): $(basename "$dir")" "^\| 1 \|" python3 tests/gpu/hf_generate.py "$dir"
        done
    fi
    ;;
*)
    echo "unknown step $step" >&2
    exit 2
    ;;
esac
echo
cat "$OUT/results.md"
