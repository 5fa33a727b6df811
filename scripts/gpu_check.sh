#!/usr/bin/env bash
# The GPU check: policy serving (one batched server vs one model copy per worker) and MuJoCo
# rendering (EGL on the GPU vs the CPU's software renderers), in one run of a few minutes.
#
#   scripts/gpu_check.sh                 # on a machine with an NVIDIA GPU, from the repository root
#   scripts/gpu_check.sh --cpu --quick   # the same steps on the CPU with small models (~2-3 min)
#
# Results go to $OUT (default ./gpu-check-out): gpu_serving.{md,json}, gpu_render.{md,json},
# gpu_check.log. Works offline: nothing is downloaded except, when the Python it finds lacks
# packages, the `pip install` that it then tries (and explains how to avoid when it fails).
#
# Python: $HUD_GPU_PYTHON, else .venv-gpu/bin/python, else python3, whichever first imports
# torch, lerobot, diffusers, gymnasium, mujoco, websockets and msgpack; pytest_hud is taken from this
# checkout. On a machine with no network (the lent GPU machines): `scripts/gpu_wheels.sh`, run
# where pip reaches PyPI, puts what such a machine's Python lacks into .whl/part-N/; carry the parts
# (one per call where they do not travel together; `--install-only` for all but the last) and
# .gl/ (Debian's EGL/GL packages, where the machine has no libEGL): this script installs the wheels
# with --no-index into .hud-site/ (kept between calls) before it looks for a Python.
#
#   scripts/gpu_check.sh --install-only  # only add the carried wheels to .hud-site/, then stop
set -uo pipefail

DEVICE=cuda
QUICK=()
INSTALL_ONLY=0
for arg in "$@"; do
  case "$arg" in
    --cpu) DEVICE=cpu ;;
    --quick) QUICK=(--quick) ;;
    --install-only) INSTALL_ONLY=1 ;;
    -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
    *) echo "gpu_check.sh: unknown argument $arg (use --cpu, --quick, --install-only)" >&2; exit 2 ;;
  esac
done

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT" || exit 2
OUT="${OUT:-$ROOT/gpu-check-out}"
mkdir -p "$OUT"
LOG="$OUT/gpu_check.log"
: > "$LOG"
say() { echo "$*" | tee -a "$LOG"; }

export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 SDL_VIDEODRIVER=dummy TOKENIZERS_PARALLELISM=false
export MUJOCO_GL="${MUJOCO_GL:-egl}"

# Carried packages first: Debian's GL/EGL libraries (.gl/*.deb) and wheels (.whl/*.whl), no network.
if compgen -G "$ROOT/.gl/*.deb" >/dev/null && [ "$(id -u)" -eq 0 ]; then
  for deb in "$ROOT"/.gl/*.deb; do dpkg -x "$deb" / >>"$LOG" 2>&1; done
  ldconfig >>"$LOG" 2>&1
  say "# unpacked $(ls "$ROOT"/.gl/*.deb | wc -l) carried GL packages"
fi
SITE="$ROOT/.hud-site"
mapfile -t WHEELS < <(find "$ROOT/.whl" -type f -name '*.whl' 2>/dev/null | sort)
if [ "${#WHEELS[@]}" -gt 0 ]; then
  if python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
       "${WHEELS[@]}" >>"$LOG" 2>&1; then
    say "# installed ${#WHEELS[@]} carried wheels into $SITE"
  else
    say "gpu_check.sh: the carried wheels in .whl/ did not install (pip's output is in $LOG)"
  fi
fi
[ -d "$SITE" ] && export PYTHONPATH="$PYTHONPATH:$SITE"
if [ "$INSTALL_ONLY" -eq 1 ]; then say "# --install-only: done"; exit 0; fi
# NVIDIA's EGL vendor file where the lent machines keep it (the driver's read-only mount)
for vendor in /usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json; do
  [ -f "$vendor" ] && export HUD_NVIDIA_EGL_VENDOR="$vendor"
done

NEEDED="torch lerobot.policies diffusers gymnasium mujoco websockets msgpack numpy pytest_hud"
missing() {  # the modules of $NEEDED that python $1 cannot import (empty: all good)
  "$1" - "$NEEDED" <<'EOF' 2>/dev/null || echo "(python does not run)"
import importlib, sys
bad = []
for name in sys.argv[1].split():
    try:
        importlib.import_module(name)
    except Exception as exc:  # noqa: BLE001
        bad.append(f"{name} ({type(exc).__name__})")
print(" ".join(bad))
EOF
}

PY=""
for candidate in "${HUD_GPU_PYTHON:-}" "$ROOT/.venv-gpu/bin/python" "$(command -v python3 || true)"; do
  [ -n "$candidate" ] && [ -x "$candidate" ] || continue
  lacks="$(missing "$candidate")"
  if [ -z "$lacks" ]; then PY="$candidate"; break; fi
  say "# $candidate lacks: $lacks"
done

if [ -z "$PY" ]; then
  BASE=""
  for v in python3.12 python3.11 python3; do
    if command -v "$v" >/dev/null && "$v" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then BASE="$(command -v "$v")"; break; fi
  done
  if [ -z "$BASE" ]; then
    say "gpu_check.sh: no Python >= 3.11 here; install one, or set HUD_GPU_PYTHON to a Python with torch and lerobot"
    exit 3
  fi
  say "# installing into $ROOT/.venv-gpu with $BASE (pip install -e '.[lerobot,test]' 'gymnasium[mujoco]')"
  # LeRobot 0.6.1 on Python >= 3.12, 0.4.4 on 3.11; the venv sees the machine's own torch
  CONSTRAINTS=(-c constraints/lerobot.txt)
  if "$BASE" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then CONSTRAINTS=(-c constraints/lerobot-0.4.txt); fi
  if ! { "$BASE" -m venv --system-site-packages "$ROOT/.venv-gpu" \
         && "$ROOT/.venv-gpu/bin/python" -m pip install -q -e ".[lerobot,test]" "gymnasium[mujoco]" "${CONSTRAINTS[@]}"; } >>"$LOG" 2>&1; then
    say "gpu_check.sh: could not install the packages (no network?; pip's output is in $LOG)."
    say "  Fix: run where pip can reach PyPI, or point HUD_GPU_PYTHON at a Python that imports: $NEEDED"
    say "  (e.g. a venv made elsewhere with: pip install -e '.[lerobot,test]' 'gymnasium[mujoco]')"
    exit 3
  fi
  PY="$ROOT/.venv-gpu/bin/python"
  lacks="$(missing "$PY")"
  if [ -n "$lacks" ]; then say "gpu_check.sh: after installing, $PY still lacks: $lacks"; exit 3; fi
fi

say "# python: $PY"
"$PY" - <<'EOF' 2>&1 | grep -v Warning | tee -a "$LOG"
import platform, torch, lerobot, mujoco
print(f"# python {platform.python_version()}, torch {torch.__version__}, lerobot {lerobot.__version__}, mujoco {mujoco.__version__}")
print(f"# cuda available: {torch.cuda.is_available()}" + (f", {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else ""))
EOF
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | sed 's/^/# gpu: /' | tee -a "$LOG"

status=0
say ""
say "## policy serving ($DEVICE)"
timeout 450 "$PY" benchmarks/gpu_serving.py --device "$DEVICE" "${QUICK[@]}" --out "$OUT" 2>&1 \
  | grep --line-buffered -v -e Warning -e 'warnings.warn' | tee -a "$LOG"
rc=${PIPESTATUS[0]}; [ "$rc" -eq 0 ] || { say "gpu_check.sh: the serving benchmark failed (exit $rc)"; status=1; }

say ""
say "## MuJoCo rendering"
timeout 120 "$PY" benchmarks/gpu_render.py "${QUICK[@]}" --out "$OUT" 2>&1 | tee -a "$LOG"
rc=${PIPESTATUS[0]}; [ "$rc" -eq 0 ] || { say "gpu_check.sh: the rendering benchmark failed (exit $rc)"; status=1; }

say ""
say "# results in $OUT"
exit $status
