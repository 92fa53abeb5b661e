#!/bin/bash
# One lent GPU machine, one call: build llama.cpp with CUDA from the pinned llama-cpp-python's
# sources, point llama-cpp-python at it, then measure with every layer on the GPU, one of two sets:
#   engine    ggbatch against llama-batched-bench, whole jobs, where a step goes, the VRAM plan
#   weighing  the lm-eval runs against their peers (MMLU log-likelihood, GSM8K greedy),
#             n = 8 samples against llama-server, top-5 token log-probabilities against none
#             (and worked out during the next decode against before it), `ggbatch eval` against
#             lm-eval's own command line
# Steps already done on a still-warm machine are skipped.
#
# Prepared on the developer's machine by `bash bench/gpu_prepare.sh` (nothing of it is committed):
# .gpu/ (trimmed llama.cpp sources, llama-cpp-python's Python files, the ../shared files read) and
# .whl/ (wheels the machine's Python lacks); carry both.
# Usage there: bash bench/gpu_session.sh [SECONDS] [engine|weighing]
#   (stops starting new steps after SECONDS)
set -u
START=$(date +%s)
BUDGET=${1:-520}
SET=${2:-engine}
case $SET in
  engine) TARGETS="llama llama-batched-bench" ;;
  weighing) TARGETS="llama llama-server" ;;
  *) echo "unknown set $SET: engine or weighing" >&2; exit 2 ;;
esac
ROOT=$(pwd)
WORK=$ROOT/.gpubuild          # ignored: kept between calls on a warm machine
RES=$WORK/results
OUTDIR=${OUT:-/tmp/gpu-out}
mkdir -p "$RES" "$OUTDIR"
export PYTHONUNBUFFERED=1 XDG_CACHE_HOME=$WORK/cache HF_HOME=$WORK/cache/hf HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1
left() { echo $((BUDGET - ($(date +%s) - START))); }
pack() { tail -c 200000 "$RES/build.log" >"$RES/build.tail" 2>/dev/null; tar czf "$OUTDIR/results.tgz" --exclude=build.log -C "$WORK" results; }
trap pack EXIT

{ nvidia-smi; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv; nproc; free -g;
  python3 --version; nvcc --version | tail -2; } >"$RES/env.txt" 2>&1

python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || exit 3
# ggbatch as its import name, over this working tree (pyproject maps package/, runner/, workers/)
mkdir -p /tmp/gg/ggbatch && cp -rsf "$ROOT/package/." /tmp/gg/ggbatch/ \
  && ln -sfn "$ROOT/runner" /tmp/gg/ggbatch/runner && ln -sfn "$ROOT/workers" /tmp/gg/ggbatch/workers
export PYTHONPATH=/tmp/gg:/tmp/site:$ROOT/.gpu/py${PYTHONPATH:+:$PYTHONPATH}
# the ../shared the benchmarks expect beside the checkout
[ -e ../shared ] || ln -s "$ROOT/.gpu/shared" ../shared

B=$WORK/build
built() { for t in $TARGETS; do [ -e "$B/bin/$t" ] || [ -e "$B/bin/lib$t.so" ] || return 1; done; }
if ! built; then
  export PATH=/usr/local/cuda/bin:$PATH
  rm -rf "$WORK/src" && mkdir -p "$WORK/src" && tar xJf .gpu/src.tar.xz -C "$WORK/src"
  t0=$(date +%s)
  { cmake -S "$WORK/src" -B "$B" -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DBUILD_SHARED_LIBS=ON \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_USE_PREBUILT_UI=OFF \
      -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DCMAKE_BUILD_TYPE=Release \
    && ninja -C "$B" $TARGETS; } >"$RES/build.log" 2>&1
  status=$?
  echo "build: exit $status in $(( $(date +%s) - t0 )) s" | tee -a "$RES/steps.txt"
  [ $status -eq 0 ] || { tail -40 "$RES/build.log"; exit 4; }
fi
export LLAMA_CPP_LIB_PATH=$B/bin LD_LIBRARY_PATH=$B/bin:${LD_LIBRARY_PATH:-}
python3 -m ggbatch --version >"$RES/version.txt" 2>&1; cat "$RES/version.txt"

step() {  # step NAME SECONDS COMMAND...: run once (a file marks it done), within the budget
  local name=$1 limit=$2; shift 2
  [ -e "$RES/$name.done" ] && return 0
  local l; l=$(left)
  [ "$l" -gt 30 ] || { echo "$name: skipped, $l s left" | tee -a "$RES/steps.txt"; return 1; }
  [ "$limit" -lt "$l" ] || limit=$l
  local t0; t0=$(date +%s)
  timeout "$limit" "$@" >"$RES/$name.txt" 2>"$RES/$name.err"
  local status=$?
  echo "$name: exit $status in $(( $(date +%s) - t0 )) s" | tee -a "$RES/steps.txt"
  [ $status -eq 0 ] && touch "$RES/$name.done"
  tail -25 "$RES/$name.txt"
  [ $status -eq 0 ] || tail -15 "$RES/$name.err"
  return $status
}

MODEL=$XDG_CACHE_HOME/ggbatch/bench-28x1024-q4_k_m.gguf
step model 150 python3 -c "import sys; sys.path.insert(0, 'bench'); from engine_bench import bench_model; print(bench_model())"
engine_set() {
  step vs_bb 200 python3 bench/vs_batched_bench.py --batched-bench "$B/bin/llama-batched-bench" --model "$MODEL" \
    --gpu-layers all --npl "${NPL:-1,8,32,64,128,255}" --rounds 1 --threads 1 --json "$RES/vs_bb.json"
  step jobs 150 python3 bench/gpu_jobs.py --model "$MODEL" --json "$RES/jobs.json" \
    --runs "${JOBS:-W4;W4:--slots=255;W4:--slots=255,--n-batch=2048;LSAT;LSAT:--slots=255,--n-batch=2048}"
  step bench_split 90 python3 -m ggbatch bench --model "$MODEL" --gpu-layers all --npl "${SPLIT_NPL:-64,255}" --threads 1 \
    --no-runner --json "$RES/bench_split.json"
  # The memory plan's VRAM figure against what the card says is used while a job runs.
  step vram 90 bash -c "nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 200 \
    >'$RES/vram_used_mib.txt' & sampler=\$!; python3 bench/gpu_jobs.py --model '$MODEL' --runs W4 \
    --json '$RES/vram_job.json'; status=\$?; kill \$sampler; exit \$status"
  [ -e "$RES/vram.done" ] && python3 -c "
import json; r = json.load(open('$RES/vram_job.json'))[0]['report']['memory']['plan']
used = [int(x) for x in open('$RES/vram_used_mib.txt').read().split() if x.isdigit()]
print('VRAM planned', r.get('vram_per_worker_mib'), 'MiB a worker; card peak used', max(used, default=0), 'MiB')"
}

weighing_set() {  # each side once a round
  local gpu="--gpu-layers all"
  step imports 60 python3 -c "import datasets, lm_eval, llama_cpp.server.app, pyarrow, ggbatch.lm_eval
print('lm_eval', lm_eval.__version__, 'datasets', datasets.__version__, 'pyarrow', pyarrow.__version__)"
  step gsm8k 150 python3 bench/lmeval_compare.py --model "$MODEL" --task gsm8k --repeat 2 $gpu
  step samples 150 python3 bench/samples_bench.py --model "$MODEL" --server "$B/bin/llama-server" $gpu
  step logprobs 100 python3 bench/logprobs_bench.py --model "$MODEL" --repeat 2 $gpu
  step later 60 python3 bench/later_logprobs_bench.py --model "$MODEL" --repeat 2 $gpu
  step mmlu 90 python3 bench/lmeval_compare.py --model "$MODEL" --task mmlu --repeat 2 --no-peer $gpu
  step engine32 60 python3 -m ggbatch bench --model "$MODEL" $gpu --npl 32 --threads 1 --no-runner
  # The user's command against lm-eval's own command line, both on ggbatch's backend: lm-eval's
  # own time that ggbatch eval cuts (its task index, its templates)
  step commands 120 python3 bench/eval_commands_bench.py --model "$MODEL" --task mmlu --repeat 2 $gpu
  # Last: the MMLU peer (llama-cpp-python inside lm-eval's process) crashed on the first H100
  # lease (a segmentation fault, or free(): invalid pointer), also without ggbatch in the process;
  # here its model lives in a process of its own.
  step mmlu_peer 120 python3 bench/lmeval_compare.py --model "$MODEL" --task mmlu --repeat 2 --peer-in-child $gpu
}

${SET}_set
cat "$RES/steps.txt"
