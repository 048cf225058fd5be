#!/usr/bin/env bash
# Makes the hashed lock files in env/lock/ from pyproject.toml and the platform's torch (env/lock/<platform>.in)
# with uv, for CPython 3.11 and later on every platform (a universal resolution).
#   usage: env/lock.sh {cpu|cpu-dev|cuda|rocm} [--find-links DIR]
#   cpu      env/lock/cpu.txt       runtime, PyTorch's CPU build (from https://download.pytorch.org/whl/cpu)
#   cpu-dev  env/lock/cpu-dev.txt   the same plus the dev extra (tests, lint): what CI installs
#   cuda     env/lock/cuda.txt      runtime, PyPI's default torch (the CUDA build)
#   rocm     env/lock/rocm.txt      runtime, PyTorch's ROCm build (from $GPULAB_ROCM_INDEX, default rocm7.1)
# Where torch comes from PyTorch's index (cpu, cpu-dev, rocm), its pin also goes to a lock of its own,
# env/lock/torch-cpu.txt or env/lock/torch-rocm.txt, the only lock that names that index: installed first with
# --no-deps, it leaves the platform's lock PyPI-only, so pip never asks PyTorch's index for anything else.
# Needs the platform's PyTorch index (cpu, rocm), or --find-links DIR: a folder holding that torch's wheels,
# used in place of the index to resolve (the torch lock still names the index, where users get torch from). The
# locks then hold the hashes of the wheels found there only; regenerate where the index can be reached to
# list every wheel's hash.
set -euo pipefail
cd "$(dirname "$0")/.."
usage="usage: env/lock.sh {cpu|cpu-dev|cuda|rocm} [--find-links DIR]"
platform=${1:?$usage}; shift
find_links=
while [ $# -gt 0 ]; do
  case "$1" in
    --find-links) find_links=${2:?$usage}; shift 2 ;;
    *) echo "$usage" >&2; exit 2 ;;
  esac
done
extras=(); torch_index=; torch_lock=; torch_packages=(torch)
case "$platform" in
  cpu | cpu-dev)
    torch_index=https://download.pytorch.org/whl/cpu; input=env/lock/cpu.in; torch_lock=env/lock/torch-cpu.txt
    torch_users="env/lock/cpu.txt, env/lock/cpu-dev.txt"
    [ "$platform" = cpu ] || extras=(--extra dev) ;;
  cuda) input=env/lock/cuda.in ;;
  rocm)
    torch_index=${GPULAB_ROCM_INDEX:-https://download.pytorch.org/whl/rocm7.1}; input=env/lock/rocm.in
    torch_lock=env/lock/torch-rocm.txt; torch_users=env/lock/rocm.txt; torch_packages=(torch pytorch-triton-rocm) ;;
  *) echo "$usage" >&2; exit 2 ;;
esac
command -v uv >/dev/null || { echo "env/lock.sh: needs uv (pip install uv)" >&2; exit 1; }
sources=(--index-url https://pypi.org/simple)
if [ -n "$find_links" ]; then
  sources+=(--find-links "$find_links" --no-emit-find-links)
elif [ -n "$torch_index" ]; then
  # pip's semantics (the best version across indexes), not uv's first-index: PyTorch's index mirrors some
  # of PyPI's packages at older versions.
  sources+=(--extra-index-url "$torch_index" --index-strategy unsafe-best-match)
fi
out=env/lock/$platform.txt
body=$(mktemp)
trap 'rm -f "$body"' EXIT
# --fork-strategy fewest: one version of a package for every Python where one fits, so results do not hang
# on the interpreter's minor version.
UV_PYTHON_DOWNLOADS=never uv pip compile pyproject.toml "$input" "${extras[@]}" "${sources[@]}" \
  --universal --python-version 3.11 --fork-strategy fewest --generate-hashes --no-emit-index-url \
  --custom-compile-command "env/lock.sh $platform" --quiet -o "$body"
if [ -z "$torch_lock" ]; then
  cp "$body" "$out"
  echo "$out: $(grep -c '^[a-z0-9]' "$out") pinned packages"
  exit 0
fi
{
  echo "# PyPI only: install $torch_lock first, with --no-deps (README.md); the torch pinned here is"
  echo "# then already installed, and pip asks no other index."
  cat "$body"
} >"$out"
# The torch lock: the entries of the packages PyTorch's index serves, hashes included, as in the lock above.
{
  echo "# torch from PyTorch's index, installed first and on its own:"
  echo "#   pip install --no-deps --require-hashes -r $torch_lock"
  echo "# Its dependencies come from the platform's lock ($torch_users), which pins the same torch."
  echo "--extra-index-url $torch_index"
  awk -v names="${torch_packages[*]}" '
    BEGIN { split(names, list, " "); for (i in list) keep[list[i]] = 1 }
    /^[a-z0-9]/ { name = $1; sub(/[=;].*/, "", name); take = (name in keep) }
    take && !/^ *#/' "$body"
} >"$torch_lock"
echo "$out: $(grep -c '^[a-z0-9]' "$out") pinned packages; $torch_lock: $(grep -c '^[a-z0-9]' "$torch_lock")"
