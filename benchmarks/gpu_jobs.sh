#!/usr/bin/env bash
# The user's jobs on the borrowed GPU machine, CUDA against its own CPU (benchmarks/gpu_jobs.py says what runs and
# what is asserted). That machine lacks tyro and gguf and reaches no network, and a call carries at most 64 MiB,
# so the default model (a 98 MB GGUF) travels in two halves:
#   bash benchmarks/gpu_jobs.sh bundle            # here: wheels + the GGUF's halves into bench_out/gpu_bundle/
#   device run, carry [bench_out/gpu_bundle/wheels, bench_out/gpu_bundle/model.part-aa]:
#       bash benchmarks/gpu_jobs.sh smoke         # unpacks the wheels; memtoc --help there
#   device run at once (the machine stays warm 30 s), carry [bench_out/gpu_bundle/model.part-ab]:
#       bash benchmarks/gpu_jobs.sh run $OUT [gpu_jobs.py options]
#   or  bash benchmarks/gpu_jobs.sh check $OUT [gpu_check.py options]   # the GPU check on the trained weights
# `run` writes its runs under bench_out/gpu_jobs/ and copies gpu_jobs.json, its log and a tarball of the runs
# (no stores, plots or vectors) to the folder given: the device returns at most 8 files from $OUT.
set -euo pipefail
cd "$(dirname "$0")/.."
B=bench_out/gpu_bundle
SITE="$B/site"
PY="${PYTHON:-python3}"
# the GGUF from its halves, then a script run with the carried wheels and a model cache of its own
on_model() { cat "$B"/model.part-a? > "$B/model.gguf"; MEMTOC_MODEL_CACHE="$PWD/$B/cache" PYTHONPATH="$PWD:$PWD/$SITE" "$PY" "$@"; }
# DEST is where results go: never the bundle (the inputs) or the runs folder `run` clears
dest() {
  [ $# -ge 2 ] || usage
  case "$(realpath -m "$2")/" in
    "$(realpath -m "$B")"/*|"$(realpath -m bench_out/gpu_jobs)"/*) echo "gpu_jobs.sh: DEST $2 is inside $B or bench_out/gpu_jobs (its inputs and runs); give another folder" >&2; exit 2 ;;
  esac
}
usage() { echo "usage: bash benchmarks/gpu_jobs.sh bundle | smoke | run DEST [gpu_jobs.py options] | check DEST [gpu_check.py options]" >&2; exit 2; }
case "${1:-}" in
  bundle)
    mkdir -p "$B/wheels"
    GGUF=$(PYTHONPATH=$PWD .venv/bin/python -c "from memtoc.backends.models import resolve_model; print(resolve_model('default').weight_files()[0])")
    .venv/bin/pip download --quiet --no-deps --dest "$B/wheels" --only-binary=:all: --python-version 3.12 \
      --platform manylinux2014_x86_64 --implementation cp \
      "tyro==1.0.17" "docstring-parser==0.18.0" "typeguard==4.6.1" "gguf==0.19.0" "requests==2.34.2" \
      "urllib3==2.8.0" "idna==3.20" "certifi==2026.10.19.post1" "charset-normalizer==3.5.3"
    split -b 50000000 "$GGUF" "$B/model.part-"
    ls -l "$B" "$B/wheels" ;;
  smoke)
    mkdir -p "$SITE"
    for w in "$B"/wheels/*.whl; do "$PY" -m zipfile -e "$w" "$SITE"; done
    PYTHONPATH="$PWD:$PWD/$SITE" "$PY" -m memtoc.cli --help > "$B/help.txt"; head -3 "$B/help.txt"
    PYTHONPATH="$PWD:$PWD/$SITE" "$PY" -c "import gguf, tyro; print('gguf', gguf.__file__, 'tyro', tyro.__version__)"
    ls -l "$B" ;;
  run)
    dest "$@"
    DEST="$2"; shift 2
    R=bench_out/gpu_jobs
    rm -rf "$R"; mkdir -p "$DEST"
    { if command -v nvidia-smi >/dev/null 2>&1; then nvidia-smi -L || true; fi; uptime; } > "$DEST/gpu_jobs.log"
    rc=0
    on_model benchmarks/gpu_jobs.py --model "$PWD/$B/model.gguf" --out "$R" "$@" >> "$DEST/gpu_jobs.log" 2>&1 || rc=$?
    cp "$R/gpu_jobs.json" "$DEST/" || true
    tar czf "$DEST/gpu_jobs_runs.tgz" --exclude='*.h5' --exclude='*.png' --exclude='*.safetensors' -C bench_out gpu_jobs
    tail -16 "$DEST/gpu_jobs.log"
    exit $rc ;;
  check)
    # benchmarks/gpu_check.py on the default model's trained weights instead of random ones
    dest "$@"
    DEST="$2"; shift 2
    mkdir -p "$DEST"
    on_model benchmarks/gpu_check.py --weights "$PWD/$B/model.gguf" --out "$DEST/gpu_check_trained.json" "$@" \
      > "$DEST/gpu_check_trained.log" 2>&1 || rc=$?
    grep "^gpu_check" "$DEST/gpu_check_trained.log"
    exit "${rc:-0}" ;;
  *) usage ;;
esac
