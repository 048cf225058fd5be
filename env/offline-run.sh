#!/usr/bin/env bash
# Runs the workflow on an offline GPU host that has its own PyTorch: installs what the host lacks from a
# wheelhouse (made beside a network by env/wheelhouse.sh, copied over with the checkout), runs Snakemake with a
# preset for the given target files, and can pack results/TARGET/ in pieces into a folder.
#   usage: env/offline-run.sh [OPTIONS] TARGET PRESET [FILE...]   e.g. env/offline-run.sh h100 presets/quick.yaml
#   TARGET           the machine class, passed as --config target=TARGET (results go to results/TARGET/)
#   PRESET           a config file laid over config.yaml: a path, or a name in presets/ (quick, full, mlp, ...)
#   FILE             the outputs to make (default: everything)
#   --wheelhouse DIR install from DIR offline first (default: .whl when it holds requirements.txt)
#   --config K=V     more configuration after the preset's (repeat it), e.g. --config "llm={engines:[fast]}"
#   --time-limit S   stop Snakemake after S seconds, in time to pack what finished; the same command run again
#                    redoes the jobs it stopped and goes on with the rest (for schedulers that limit a job's time)
#   --pack DIR       write Snakemake's log to DIR/snakemake.log and results/TARGET/ to DIR as
#                    results-TARGET.tgz.partNN pieces (join: cat DIR/results-TARGET.tgz.part* | tar xz)
#   --piece-size N   the pieces' size, as split -b takes it (default 15M)
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
usage="usage: env/offline-run.sh [--wheelhouse DIR] [--config K=V]... [--time-limit S] [--pack DIR] [--piece-size N]
                          TARGET PRESET [FILE...]"
fail() { echo "env/offline-run.sh: $*" >&2; exit 2; }
wheelhouse=; config=(); time_limit=0; pack=; piece_size=15M
while [ $# -gt 0 ]; do
  case "$1" in
    --wheelhouse) wheelhouse=${2:?$usage}; shift 2 ;;
    --config) config+=("${2:?$usage}"); shift 2 ;;
    --time-limit) time_limit=${2:?$usage}; shift 2 ;;
    --pack) pack=${2:?$usage}; shift 2 ;;
    --piece-size) piece_size=${2:?$usage}; shift 2 ;;
    -h | --help) echo "$usage"; exit 0 ;;
    -*) fail "unknown option $1"$'\n'"$usage" ;;
    *) break ;;
  esac
done
[ $# -ge 2 ] || fail "$usage"
target=$1; preset=$2; shift 2
[[ $target =~ ^[A-Za-z0-9][A-Za-z0-9_.-]*$ ]] || fail "TARGET '$target' is not a name (letters, digits, _ . -)"
if [ ! -f "$preset" ] && [ -f "$repo/presets/$preset.yaml" ]; then preset=$repo/presets/$preset.yaml; fi
[ -f "$preset" ] || fail "no preset $preset (presets/: $(cd "$repo/presets" && ls ./*.yaml | sed 's|^\./||; s|\.yaml$||' | xargs))"
[[ $time_limit =~ ^[0-9]+$ ]] || fail "--time-limit takes whole seconds, not '$time_limit'"
[[ $piece_size =~ ^[0-9]+[KMG]?$ ]] || fail "--piece-size takes a size such as 15M, not '$piece_size'"
# Paths given relative to where the command is run; the workflow runs in the checkout.
absolute() { case $1 in /*) echo "$1" ;; *) echo "$PWD/$1" ;; esac; }
preset=$(absolute "$preset")
[ -z "$pack" ] || pack=$(absolute "$pack")
[ -z "$wheelhouse" ] || wheelhouse=$(absolute "$wheelhouse")
cd "$repo" || exit 2
export PYTHONUNBUFFERED=1
if [ -z "$wheelhouse" ] && [ -f .whl/requirements.txt ]; then wheelhouse=.whl; fi
if [ -n "$wheelhouse" ]; then
  [ -f "$wheelhouse/requirements.txt" ] || fail "no $wheelhouse/requirements.txt: make it with env/wheelhouse.sh $wheelhouse"
  # Offline, from the wheelhouse only; what the host already has at a fitting version stays.
  python3 -m pip install -q --no-index --find-links "$wheelhouse" -r "$wheelhouse/requirements.txt" 2>&1 \
    | grep -v WARNING | tail -3
elif ! python3 -c "import snakemake" 2>/dev/null; then
  fail "no snakemake here and no wheelhouse: make one with env/wheelhouse.sh .whl beside a network, copy it over"
fi
# No install of gpulab itself: the Snakefile runs this checkout's src/gpulab.
nvidia-smi -L 2>/dev/null || rocm-smi --showproductname 2>/dev/null || true
settings=(--configfile "$preset" --config target="$target" "${config[@]}")
# A Snakemake stopped by the time limit (timeout's -k) leaves its lock behind; one Snakemake runs here at a
# time, so a lock found here is that stale one, and the next run would refuse to start without this.
if [ -n "$(ls -A .snakemake/locks 2>/dev/null)" ]; then
  echo "removing the lock a stopped Snakemake left"
  python3 -m snakemake --unlock --cores 1 "${settings[@]}" >/dev/null 2>&1
fi
run_snakemake() {
  timeout -k 15 "$time_limit" python3 -m snakemake --cores "$(nproc)" --keep-going --rerun-incomplete \
    "${settings[@]}" -- "$@"
}
SECONDS=0
# Every core: CPU-only jobs (ahead-of-time compiles, the tiny model, aggregates, the report) run beside the
# device jobs, whose device work the device lock keeps one at a time (workflow/rules/common.smk). The log goes
# to a file, not through a pipe: a stopped job's compile workers (Inductor's) keep a pipe open, so `| tee`
# would wait past the time limit.
if [ -n "$pack" ]; then
  mkdir -p "$pack" && run_snakemake "$@" >"$pack/snakemake.log" 2>&1
  status=$?
  tail -60 "$pack/snakemake.log"
else
  run_snakemake "$@"
  status=$?
fi
echo "snakemake exit $status after ${SECONDS}s"
if [ -n "$pack" ] && [ -d "results/$target" ]; then
  archive=$pack/results-$target.tgz
  rm -f "$archive".part*
  tar czf "$archive" "results/$target" && split -b "$piece_size" -d "$archive" "$archive.part" && rm -f "$archive"
  ls -la "$pack"
fi
exit "$status"
