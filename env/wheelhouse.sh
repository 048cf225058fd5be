#!/usr/bin/env bash
# Builds a wheelhouse for an offline GPU host from a lock file: the locked versions (hashes checked here) of
# the packages the host lacks and everything they need, as wheels for the host's Python and platform (a
# package published as source only is built into a wheel here; it must be pure Python).
#   usage: env/wheelhouse.sh [--lock FILE] [--python X.Y] [--platform TAG] DIR [PACKAGE ...]
#   --lock      the lock the versions come from (default: env/lock/cuda.txt)
#   --python    the host's Python (default: 3.12)
#   --platform  a wheel platform tag the host accepts (default: manylinux_2_28_x86_64; repeat for more)
#   PACKAGE     what the host lacks (default: snakemake jsonschema modelscope: a GPU host's PyTorch environment
#               has torch and the scientific stack; name more when it lacks them)
# DIR/requirements.txt names the packages; on the host, with the checkout and DIR copied over,
# env/offline-run.sh --wheelhouse DIR TARGET PRESET (DIR .whl is its default) installs them before it runs, as
#   python3 -m pip install --no-index --find-links DIR -r DIR/requirements.txt
# does: pip installs what is missing, resolving against what the host already has, from DIR only. Packages that
# need torch (accelerate, transformers) resolve from the CUDA lock only, the default: a CPU lock pins torch's
# +cpu build, which is on PyTorch's index (env/lock/torch-cpu.txt), and this script asks PyPI alone.
set -euo pipefail
cd "$(dirname "$0")/.."
usage="usage: env/wheelhouse.sh [--lock FILE] [--python X.Y] [--platform TAG] DIR [PACKAGE ...]"
lock=env/lock/cuda.txt; python=3.12; platforms=()
while [ $# -gt 0 ]; do
  case "$1" in
    --lock) lock=${2:?$usage}; shift 2 ;;
    --python) python=${2:?$usage}; shift 2 ;;
    --platform) platforms+=("${2:?$usage}"); shift 2 ;;
    -h | --help) echo "$usage"; exit 0 ;;
    -*) echo "$usage" >&2; exit 2 ;;
    *) break ;;
  esac
done
dir=${1:?$usage}; shift
packages=("$@"); [ ${#packages[@]} -gt 0 ] || packages=(snakemake jsonschema modelscope)
[ ${#platforms[@]} -gt 0 ] || platforms=(manylinux_2_28_x86_64)
[ -f "$lock" ] || { echo "env/wheelhouse.sh: no lock file $lock (env/lock.sh makes it)" >&2; exit 1; }
command -v uv >/dev/null || { echo "env/wheelhouse.sh: needs uv (pip install uv)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The lock's pins as constraints: the packages and their dependencies at the lock's versions, resolved for the
# host's Python and platform (the lock is universal; markers pick the host's entries).
sed -nE 's/^([A-Za-z0-9][^ ]*==[^ ]*)( ;[^\\]*)? *\\?$/\1\2/p' "$lock" >"$work/constraints.txt"
printf '%s\n' "${packages[@]}" >"$work/packages.in"
UV_PYTHON_DOWNLOADS=never uv pip compile "$work/packages.in" --constraint "$work/constraints.txt" \
  --python-version "$python" --python-platform "x86_64-manylinux_2_28" --generate-hashes --no-header \
  --no-annotate --quiet -o "$work/requirements.txt"
unlisted=$(sed -nE 's/^([A-Za-z0-9][^=]*)==.*/\1/p' "$work/requirements.txt" | while read -r name; do
  grep -qiE "^${name}==" "$lock" || echo "$name"; done)
[ -z "$unlisted" ] || { echo "env/wheelhouse.sh: not in $lock: $unlisted (add them to the lock)" >&2; exit 1; }
# pip takes --platform literally: a manylinux_2_X host also runs wheels built for every older glibc.
platform_args=()
for p in "${platforms[@]}"; do
  platform_args+=(--platform "$p")
  if [[ $p =~ ^manylinux_2_([0-9]+)_(.+)$ ]]; then
    arch=${BASH_REMATCH[2]}
    for ((glibc = BASH_REMATCH[1] - 1; glibc >= 5; glibc--)); do platform_args+=(--platform "manylinux_2_${glibc}_$arch"); done
    for legacy in manylinux2014 manylinux2010 manylinux1; do platform_args+=(--platform "${legacy}_$arch"); done
  fi
done
mkdir -p "$dir"
# --no-deps (the list is complete) lets pip take an sdist where a package has no wheel: built below.
python3 -m pip download --quiet --no-deps --require-hashes --implementation cp --python-version "$python" \
  "${platform_args[@]}" --platform any -d "$dir" -r "$work/requirements.txt"
for sdist in "$dir"/*.tar.gz "$dir"/*.zip; do
  [ -e "$sdist" ] || continue
  python3 -m pip wheel --quiet --no-deps -w "$work/built" "$sdist"
  rm "$sdist"
done
for wheel in "$work"/built/*.whl; do
  [ -e "$wheel" ] || continue
  # Built here, so only a pure-Python wheel also fits the host.
  [[ $wheel == *-none-any.whl ]] || { echo "env/wheelhouse.sh: $(basename "$wheel") is not pure Python" >&2; exit 1; }
  mv "$wheel" "$dir/"
done
# What the host installs: the named packages at the lock's versions (pip adds their dependencies from DIR).
for name in "${packages[@]}"; do grep -iE "^${name}==" "$work/requirements.txt" | cut -d' ' -f1; done \
  >"$dir/requirements.txt"
echo "wheelhouse: $(ls "$dir"/*.whl | wc -l) wheels, $(du -sh "$dir" | cut -f1) in $dir (CPython $python," \
  "${platforms[*]}); on the host: python3 -m pip install --no-index --find-links $dir -r $dir/requirements.txt"
