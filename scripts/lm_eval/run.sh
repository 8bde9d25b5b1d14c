#!/usr/bin/env bash
# lm-evaluation-harness against `specgen serve`: a multiple-choice task over a local file,
# scored through echo + logprobs with the server's own tokenizer routes, then every
# choice's loglikelihood checked against the target's rows (check.py).
#
#   scripts/lm_eval/run.sh TARGET.gguf DRAFT.gguf
#
# LM_EVAL: an lm_eval executable (default: installs lm-eval[api] into a venv in $WORK).
# PY: the Python with specgen (default .venv/bin/python). PORT: 8933. BATCH: lm_eval's
# --batch_size (default 1; above 1 it sends that many prompts in one request).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
target=${1:?usage: run.sh TARGET.gguf DRAFT.gguf}
draft=${2:?usage: run.sh TARGET.gguf DRAFT.gguf}
PY=${PY:-$root/.venv/bin/python}
PORT=${PORT:-8933}
BATCH=${BATCH:-1}
WORK=${WORK:-$(mktemp -d)}
mkdir -p "$WORK"
if [ -z "${LM_EVAL:-}" ]; then
    python3 -m venv "$WORK/venv"
    "$WORK/venv/bin/pip" install -q "lm-eval[api]"
    LM_EVAL=$WORK/venv/bin/lm_eval
fi
"$PY" -m specgen serve -m "$target" -md "$draft" --port "$PORT" -np 2 >"$WORK/serve.log" 2>&1 &
server=$!
trap 'kill $server 2>/dev/null || true' EXIT
for _ in $(seq 240); do
    curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break
    sleep 0.5
done
"$LM_EVAL" --version 2>/dev/null || true
(cd "$here" && HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 "$LM_EVAL" --model local-completions \
    --model_args "model=any,base_url=http://127.0.0.1:$PORT/v1/completions,num_concurrent=1" \
    --tasks specgen_mc --include_path "$here" --log_samples --output_path "$WORK/out" \
    --batch_size "$BATCH")
kill $server; wait $server 2>/dev/null || true
trap - EXIT
"$PY" "$here/check.py" "$target" "$(ls "$WORK"/out/*/samples_specgen_mc_*.jsonl | tail -1)"
