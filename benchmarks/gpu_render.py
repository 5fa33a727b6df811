"""MuJoCo offscreen rendering: EGL on the GPU against the CPU's software renderers, one run.

    python benchmarks/gpu_render.py                         # every renderer found, 128 and 224 px
    python benchmarks/gpu_render.py --quick --out OUT       # shorter rows

Each row is a fresh process (a GL context is per process) that builds a gymnasium MuJoCo env with
``render_mode="rgb_array"``, renders one warm-up frame, then steps and renders for ``--seconds``;
frames/s counts step + render. Renderers:

- ``egl-nvidia``: ``MUJOCO_GL=egl`` with ``__EGL_VENDOR_LIBRARY_FILENAMES`` naming NVIDIA's EGL vendor
  file (``10_nvidia.json``): rendering on the GPU;
- ``egl-mesa``: ``MUJOCO_GL=egl`` with Mesa's vendor file (``50_mesa.json``): llvmpipe, on the CPU;
- ``osmesa``: ``MUJOCO_GL=osmesa`` (needs ``libosmesa6``): software, on the CPU.

A renderer whose vendor file or library is missing is reported as such, not measured. Each row
also reports the ``GL_RENDERER`` string the context got (so a "GPU" row that silently fell back to
llvmpipe shows it) and both quality settings: MuJoCo's default, and ``fast`` (no multisampling,
shadows or reflections), which is what makes software rendering usable. Envs: ``HalfCheetah-v5``
and, where Meta-World is installed, ``Meta-World/MT1 reach-v3``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

VENDOR_DIRS = ("/usr/share/glvnd/egl_vendor.d", "/etc/glvnd/egl_vendor.d", "/usr/local/share/glvnd/egl_vendor.d",
               "/usr/local/nvidia/share/glvnd/egl_vendor.d")  # the driver's own, as containers mount it


def vendor_file(name: str) -> str | None:
    """The EGL vendor file whose name contains ``name`` (``nvidia``, ``mesa``), or None.

    A file named by ``__EGL_VENDOR_LIBRARY_FILENAMES`` (or ``HUD_NVIDIA_EGL_VENDOR``) comes first.
    """
    given = os.environ.get("__EGL_VENDOR_LIBRARY_FILENAMES", "").split(":")
    for path in [*given, os.environ.get("HUD_NVIDIA_EGL_VENDOR", "")]:
        if name in os.path.basename(path).lower() and os.path.isfile(path):
            return path
    for folder in VENDOR_DIRS:
        try:
            for entry in sorted(os.listdir(folder)):
                if name in entry.lower() and entry.endswith(".json"):
                    return os.path.join(folder, entry)
        except OSError:
            continue
    return None


def renderers() -> dict[str, dict[str, str] | str]:
    """Renderer name -> the environment it needs, or why it is unavailable."""
    out: dict[str, dict[str, str] | str] = {}
    for name, vendor in (("egl-nvidia", "nvidia"), ("egl-mesa", "mesa")):
        found = vendor_file(vendor)
        out[name] = ({"MUJOCO_GL": "egl", "PYOPENGL_PLATFORM": "egl", "__EGL_VENDOR_LIBRARY_FILENAMES": found}
                     if found else f"no {vendor} EGL vendor file in {', '.join(VENDOR_DIRS)}")
    import ctypes.util

    out["osmesa"] = ({"MUJOCO_GL": "osmesa", "PYOPENGL_PLATFORM": "osmesa"} if ctypes.util.find_library("OSMesa")
                     else "no libOSMesa (apt-get install libosmesa6)")
    return out


# ------------------------------------------------------------------------------- the child
def make_env(env_id: str, size: int) -> Any:
    import gymnasium as gym

    if env_id.startswith("metaworld:"):
        import metaworld  # noqa: F401 - registers the Meta-World ids

        return gym.make("Meta-World/MT1", env_name=env_id.split(":", 1)[1], seed=0, render_mode="rgb_array",
                        width=size, height=size)
    return gym.make(env_id, render_mode="rgb_array", width=size, height=size)


def child(env_id: str, size: int, quality: str, seconds: float) -> dict[str, Any]:
    import mujoco

    env = make_env(env_id, size)
    env.reset(seed=0)
    base = env.unwrapped
    if quality == "fast":
        base.model.vis.quality.offsamples = 0  # before the first render creates the offscreen buffer
    frame = env.render()
    if quality == "fast":
        scene = base.mujoco_renderer._get_viewer("rgb_array").scn
        scene.flags[mujoco.mjtRndFlag.mjRND_SHADOW] = 0
        scene.flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = 0
        frame = env.render()
    renderer = "?"
    try:
        from OpenGL.GL import GL_RENDERER, glGetString

        renderer = glGetString(GL_RENDERER).decode()
    except Exception as exc:  # noqa: BLE001 - the string is informative only
        renderer = f"? ({type(exc).__name__})"
    action = env.action_space.sample() * 0
    frames, began = 0, time.perf_counter()
    while time.perf_counter() - began < seconds:
        _, _, terminated, truncated, _ = env.step(action)
        if terminated or truncated:
            env.reset()
        frame = env.render()
        frames += 1
    elapsed = time.perf_counter() - began
    env.close()
    return {"fps": frames / elapsed, "frames": frames, "gl_renderer": renderer, "shape": list(frame.shape),
            "mean_pixel": float(frame.mean())}


# ------------------------------------------------------------------------------ the parent
def measure(env_id: str, renderer: str, setting: dict[str, str], size: int, quality: str, seconds: float,
            timeout: float) -> dict[str, Any]:
    env = {**os.environ, **setting}
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", env_id, str(size), quality, str(seconds)]
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd="/tmp")
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        return {"error": tail[:200]}
    return json.loads(lines[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--child", nargs=4, metavar=("ENV", "SIZE", "QUALITY", "SECONDS"), help=argparse.SUPPRESS)
    parser.add_argument("--envs", nargs="+", default=None, help="gymnasium ids, or metaworld:<task>")
    parser.add_argument("--sizes", nargs="+", type=int, default=[128, 224])
    parser.add_argument("--qualities", nargs="+", default=["default", "fast"])
    parser.add_argument("--renderers", nargs="+", default=None, help="egl-nvidia egl-mesa osmesa (default: all)")
    parser.add_argument("--seconds", type=float, default=None, help="rendering time per row (default 1.5; quick: 1)")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, default=None, help="folder for gpu_render.json and gpu_render.md")
    args = parser.parse_args()
    if args.child:
        env_id, size, quality, seconds = args.child
        print(json.dumps(child(env_id, int(size), quality, float(seconds))), flush=True)
        return
    seconds = args.seconds or (1.0 if args.quick else 1.5)
    envs = args.envs
    if envs is None:
        envs = ["HalfCheetah-v5"]
        try:
            import metaworld  # noqa: F401

            envs.append("metaworld:reach-v3")
        except ImportError:
            pass
        if args.quick:
            envs = envs[:1]
    available = renderers()
    chosen = args.renderers or list(available)
    rows: list[dict[str, Any]] = []
    for env_id in envs:
        for name in chosen:
            setting = available.get(name, f"unknown renderer {name!r}")
            for size in args.sizes:
                for quality in args.qualities:
                    row = {"env": env_id, "renderer": name, "size": size, "quality": quality}
                    if isinstance(setting, str):
                        row["error"] = setting
                    else:
                        row.update(measure(env_id, name, setting, size, quality, seconds, timeout=60 + 2 * seconds))
                    rows.append(row)
                    shown = row.get("error") or f"{row['fps']:.1f} frames/s ({row['gl_renderer']})"
                    print(f"# {env_id} {name} {size}px {quality}: {shown}", flush=True)
                    save(args.out, rows)  # after every row: a run cut short keeps what it measured
    print(table(rows), flush=True)


def save(out: Path | None, rows: list[dict[str, Any]]) -> None:
    if out is None:
        return
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_render.json").write_text(json.dumps(rows, indent=2))
    (out / "gpu_render.md").write_text(table(rows) + "\n")


def table(rows: list[dict[str, Any]]) -> str:
    """Frames/s per renderer, with each renderer's ratio to the fastest CPU renderer of its row."""
    lines = ["MuJoCo step + offscreen render, frames/s (ratio: to the best CPU renderer)", "",
             "| env | size | quality | renderer | frames/s | vs CPU | GL_RENDERER |", "|" + "---|" * 7]
    keys = dict.fromkeys((r["env"], r["size"], r["quality"]) for r in rows)
    for env_id, size, quality in keys:
        group = [r for r in rows if (r["env"], r["size"], r["quality"]) == (env_id, size, quality)]
        cpu = max((r["fps"] for r in group if "fps" in r and r["renderer"] != "egl-nvidia"), default=None)
        for r in group:
            if "fps" not in r:
                lines.append(f"| {env_id} | {size} | {quality} | {r['renderer']} | - | - | {r['error']} |")
                continue
            ratio = f"{r['fps'] / cpu:.2f}x" if cpu else "-"
            lines.append(f"| {env_id} | {size} | {quality} | {r['renderer']} | {r['fps']:.1f} | {ratio} | {r['gl_renderer']} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
