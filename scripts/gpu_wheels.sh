#!/usr/bin/env bash
# Wheels for scripts/gpu_check.sh on a GPU machine that has no network, fetched here, where pip can
# reach PyPI: the packages the GPU check imports that such a machine's Python (3.12, with torch) is
# known to lack, at the versions CI pins (constraints/lerobot.txt: LeRobot 0.6.1; mujoco from
# constraints/lerobot-metaworld.txt), for CPython 3.12 on manylinux x86-64, without their
# dependencies (each one the check needs is listed). They go to .whl/part-N/ (ignored by git), each
# part small enough to travel beside the checkout in one call (the device tool carries 64 MiB in
# all): carry one part per call, and gpu_check.sh adds it to .hud-site/ (ignored, kept on a warm
# machine between calls), runs the check once everything it needs imports, and otherwise says which
# part to bring next.
#
#   scripts/gpu_wheels.sh                  # the default list below
#   scripts/gpu_wheels.sh NAME [NAME ...]  # these packages instead (each pinned from the constraints)
#
# The default list leaves out what the lent machines' image has (torch, numpy, accelerate, pandas,
# pyarrow, huggingface-hub, safetensors, transformers, msgpack, pytest, ...) and what the check
# never imports: Meta-World, gym-pusht and the test tools. PyAV is in it (40 MB: LeRobot 0.6's
# policies package imports its dataset code, which requires it), so there are two parts, ~62 MB.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"

DEFAULT="lerobot av draccus datasets dill multiprocess diffusers gymnasium farama-notifications jsonlines mergedeep
mujoco glfw pyopengl termcolor toml torchcodec websockets pytz tzdata"
NAMES="${*:-$DEFAULT}"
PY="${PYTHON:-python3}"

rm -rf .whl && mkdir -p .whl/all
for name in $NAMES; do
  pin="$(grep -hi "^${name}==" constraints/lerobot.txt constraints/lerobot-metaworld.txt | head -1 || true)"
  if [ -z "$pin" ]; then
    echo "gpu_wheels.sh: $name is pinned in neither constraints/lerobot.txt nor lerobot-metaworld.txt" >&2
    exit 2
  fi
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl/all "$pin"
done
# Parts: the largest wheels first, each part filled up to what travels beside the checkout.
tree=$(git ls-files -z | du --files0-from=- -cb | tail -1 | cut -f1)
budget=$(( 64 * 1024 * 1024 - tree - 2 * 1024 * 1024 ))
part=0 used=$budget
for wheel in $(ls -S .whl/all/*.whl); do
  size=$(stat -c %s "$wheel")
  if [ $(( used + size )) -gt "$budget" ]; then part=$((part + 1)); used=0; mkdir -p ".whl/part-$part"; fi
  if [ "$size" -gt "$budget" ]; then echo "gpu_wheels.sh: $wheel alone is over $budget bytes" >&2; exit 2; fi
  mv "$wheel" ".whl/part-$part/"; used=$((used + size))
done
rmdir .whl/all
for folder in .whl/part-*; do
  echo "gpu_wheels.sh: $folder: $(ls "$folder" | wc -l) wheels, $(du -sh "$folder" | cut -f1)"
done
echo "  on the GPU machine, one call per part, carrying that part (e.g. carry [\".whl/part-1\"]):"
echo "  scripts/gpu_check.sh --install-only   (every part but the last), then scripts/gpu_check.sh"
