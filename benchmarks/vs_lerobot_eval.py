"""pytest-hud vs ``lerobot-eval`` on LeRobot's PushT from pixels: wall time and success rates, one run.

    .venv-lerobot/bin/python benchmarks/vs_lerobot_eval.py [--episodes 16] [--width 8]

Same checkpoint (the ACT that ``scripts/make_pusht_checkpoint.py`` builds; built first if missing,
outside the clock), same env (``gym_pusht/PushT-v0``, ``obs_type="pixels_agent_pos"``, 96x96
observations, 300-step limit), same episodes (seeds 1000, 1001, ... as ``lerobot-eval`` seeds its
batches), each command timed as a whole subprocess (interpreter, imports, model load, envs, all
episodes, reports):

- ``lerobot-eval --policy.path=CKPT --env.type=pusht --eval.batch_size=W --eval.n_episodes=N
  --policy.device=cpu --seed=1000 --output_dir=TMP --eval.use_async_envs=false``: one process, a
  SyncVectorEnv of W envs, one batched ``select_action`` per tick (LeRobot 0.6 defaults to an
  AsyncVectorEnv, one process per env; the flag, passed whenever the installed LeRobot knows it,
  keeps the sync setup 0.4 has by default).
- ``hud``: ``pytest evals/test_pusht.py -n W --hud-width=W``: W xdist workers, one bridge with W
  slots, each worker loading its own model copy with torch's default thread count (one per core);
- ``hud-1thread``: the same with ``OMP_NUM_THREADS=1`` (one torch thread per worker: W workers
  with one thread per core each spin-wait against each other on a small machine);
- ``hud-server``: the same with ``--hud-policy-server`` (one model copy serving all workers with
  batched forwards; workers load no torch), with the default ``--hud-vectorization=auto`` (which
  puts PushT's 8 envs, a few ms per step, in one process per core, and the default
  ``--hud-tick=auto``, which then ticks each env process on its own: lanes), the episodes of a wave
  starting together and the server's torch on the core the env processes leave it;
- ``hud-server-sync`` (not run by default): ``hud-server`` with ``--hud-vectorization=sync`` (the
  8 envs stepped one after another in the bridge's process: the default before ``auto``);
- ``hud-server-async`` (not run by default): ``hud-server`` with ``--hud-vectorization=async``
  (the bridge's 8 PushT envs step in 8 processes, so the sim, which is most of the work, uses
  every core);
- ``hud-server-processes`` (not run by default): ``hud-server`` with ``--hud-vectorization=processes``
  (the bridge's 8 envs in one process per core, 4 each: the sim uses every core);
- ``hud-server-processes-lockstep``, ``hud-server-processes-ready`` (not run by default): the same
  with the tick mode named;
- ``hud-server-threads`` (not run by default): ``hud-server`` with ``--hud-vectorization=threads``
  (the 8 envs on one thread per core in the bridge process). PushT is not safe on threads
  (``python -m pytest_hud.bridge evals/sims/pusht.py:make_pusht --width 8 --check-threads`` finds
  rewards that differ from a one-thread run): shown for its speed only, not a setup to use;
- ``hud-server-named`` (not run by default): ``hud-server`` with the checkpoint named on the
  command line (``--hud-policy=CKPT``, as ``lerobot-eval`` gets ``--policy.path``), which beats the
  suite's marker: the policy server starts at pytest's configure, before the workers boot, instead of
  when the first worker has collected and declared its tests;
- ``hud-server-ready`` (not run by default): ``hud-server`` with ``--hud-tick=ready``; ``auto`` ticks
  in lanes with a policy server and env processes (see the tick modes in docs/options.md);
- ``hud-before`` (with ``--before REF``): ``hud`` with the ``pytest_hud`` package of git ref ``REF``;
- ``hud-server-before`` (with ``--before REF``): ``hud-server`` with the ``pytest_hud`` package of git
  ref ``REF``, run in a tree of its own (``git_ref.tree_with_package``): the code before a change,
  side by side with the checkout's;
- ``hud-novideo`` (not run by default): ``hud`` with ``--hud-video=none``;
- ``hud-server-10videos`` (not run by default): ``hud-server`` with ``--hud-video-max=10``, the
  number of videos ``lerobot-eval`` writes (its ``--eval.max_episodes_rendered``, default 10): at
  most 10 videos of failed episodes, the episodes past them rendering only what the policy reads;
- ``hud-server-novideo`` (not run by default): ``hud-server`` with ``--hud-video=none``;
- ``hud-server-rerun``, ``hud-server-10videos-rerun`` (not run by default): ``hud-server`` and
  ``hud-server-10videos`` run a second time, with the pytest cache their first run (made just
  before, not timed) left, as a user re-running a suite has it: the episodes that failed then render
  their videos as they run instead of from a replay (the other setups run without the cache, as a
  first run);
- ``lerobot-eval-96``: ``lerobot-eval`` with ``--env.visualization_width=96
  --env.visualization_height=96``, the cheapest videos its CLI allows.

``lerobot-eval`` runs first and last by default (the machine's load drifts); wall-time ratios are
against the median of its runs.

What differs in what is measured:

- ``lerobot-eval`` always renders videos of its first 10 episodes (``max_episodes_rendered=10`` is
  hard-coded in ``eval_main``; no CLI flag turns it off): ``env.render()`` at the config's 384x384
  visualization size on every step, then MP4 encoding. pytest-hud's default (``--hud-video=failed``)
  encodes the 96x96 observation frames of every failed episode (here: usually all 16); the
  ``hud-novideo`` setup shows the cost without videos.
- ``lerobot-eval`` steps a batch until *all* its envs are done (an early success keeps stepping
  its autoreset env); pytest-hud frees a slot when its episode ends. With the usual 0 % success
  every episode runs its 300 steps on both sides.
- pytest-hud writes a results file, JUnit-able reports and per-episode records; ``lerobot-eval``
  writes ``eval_info.json``.

pytest runs with the plugins a ``pip install "pytest-hud[lerobot]"`` brings (xdist and pytest-hud:
``PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 -p xdist.plugin -p pytest_hud.plugin``). A development venv
also holds this repository's test plugins, and every xdist worker imports every installed plugin:
hypothesis alone costs about 1.2 CPU-seconds per process, 11 of them across a ``-n 8`` run on 2
cores. ``--all-plugins`` measures with them.

Success counts PushT's own ``is_success`` on both sides; the per-seed comparison checks that both
ran the same episodes (the policy is deterministic in eval mode, so they normally agree exactly).
Not a test: the machine is shared and noisy; only the side-by-side ratio counts.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from git_ref import check_package, tree_with_package  # noqa: E402
from pytest_hud.stats import wilson_interval  # noqa: E402

FIRST_SEED = 1000  # lerobot-eval's default --seed; its batches use seeds seed, seed+1, ...


def load_maker():
    path = ROOT / "scripts" / "make_pusht_checkpoint.py"
    spec = importlib.util.spec_from_file_location("make_pusht_checkpoint", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


WARM = ("import torch, lerobot.configs.policies, lerobot.policies.factory, lerobot.envs.utils, gym_pusht, "
        "pytest, xdist.plugin, pytest_hud.plugin, pytest_hud.serving.server")


def run_timed(command: list[str], env: dict[str, str], log: Path, python: Path,
              cwd: Path = ROOT) -> tuple[float, int]:
    # Untimed, before every timed command: the same imports both sides make, so neither pays for
    # reading torch's libraries back from disk (this machine's memory reclaim evicts them between
    # runs: one lerobot-eval took 120 s instead of 50, its rollout 47 s).
    subprocess.run([str(python), "-c", WARM], cwd=ROOT, env=env, capture_output=True)
    started = time.perf_counter()
    with open(log, "w") as out:
        code = subprocess.run(command, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT).returncode
    return time.perf_counter() - started, code


# Whether the installed lerobot-eval has ``--eval.use_async_envs`` (0.4.4 does, default false; 0.6
# defaults it to true: one subprocess per env, whose workers lack the gym_pusht namespace).
_ASYNC_FIELD = ("import dataclasses; from lerobot.configs.default import EvalConfig; "
                "print('use_async_envs' in {f.name for f in dataclasses.fields(EvalConfig)})")


def sync_env_args(python_bin: Path, env: dict[str, str]) -> list[str]:
    """``--eval.use_async_envs=false`` where lerobot-eval takes it: its envs then step in one process
    (a SyncVectorEnv), like pytest-hud's bridge by default, on every LeRobot version."""
    probe = subprocess.run([str(python_bin), "-c", _ASYNC_FIELD], env=env, capture_output=True, text=True)
    return ["--eval.use_async_envs=false"] if probe.stdout.strip() == "True" else []


def rate_text(successes: int, n: int) -> str:
    low, high = wilson_interval(successes, n)
    return f"{successes}/{n} = {successes / n:.1%}  95% CI [{low:.1%}, {high:.1%}]" if n else "no episodes"


def lerobot_eval(python_bin: Path, checkpoint: Path, args, scratch: Path, env: dict[str, str],
                 name: str, extra: list[str]) -> dict:
    lerobot_eval_bin = python_bin.parent / "lerobot-eval"
    output_dir = scratch / name
    command = [
        str(lerobot_eval_bin),
        f"--policy.path={checkpoint}",
        "--env.type=pusht",
        f"--eval.batch_size={args.width}",
        f"--eval.n_episodes={args.episodes}",
        "--policy.device=cpu",
        f"--seed={FIRST_SEED}",
        f"--output_dir={output_dir}",
        *sync_env_args(python_bin, env),
        *extra,
    ]
    log = scratch / f"{name}.log"
    wall, code = run_timed(command, env, log, python_bin)
    row = {"name": name, "command": " ".join(command), "wall_s": wall, "code": code, "log": log}
    info_file = output_dir / "eval_info.json"
    if info_file.is_file():
        info = json.loads(info_file.read_text())
        metrics = info["per_task"][0]["metrics"]
        row["successes"] = [bool(s) for s in metrics["successes"]]
        row["seeds"] = list(range(FIRST_SEED, FIRST_SEED + len(row["successes"])))
        row["max_rewards"] = [float(r) for r in metrics["max_rewards"]]
        row["inner_s"] = info["overall"]["eval_s"]
        row["videos"] = len(info["overall"].get("video_paths", []))
    return row


def pytest_hud(python_bin: Path, checkpoint: Path, args, scratch: Path, env: dict[str, str],
               name: str, extra: list[str], tree: Path = ROOT, rerun: bool = False) -> dict:
    """One timed pytest-hud run; ``rerun``: the suite's second run, its pytest cache left by a first
    run made just before (untimed), as a user re-running a suite has it."""
    results = scratch / f"{name}.jsonl"
    cache = ["-o", f"cache_dir={scratch / ('cache-' + name)}"] if rerun else ["-p", "no:cacheprovider"]
    command = [
        str(python_bin), "-m", "pytest", "evals/test_pusht.py", "-n", str(args.width),
        f"--hud-width={args.width}", "-q", *cache, f"--hud-results={results}",
        *extra,
    ]
    env = dict(env, PUSHT_CHECKPOINT=str(checkpoint), PUSHT_EPISODES=str(args.episodes),
               PUSHT_FIRST_SEED=str(FIRST_SEED))
    if not args.all_plugins:  # the plugins `pip install pytest-hud[lerobot]` brings, not this venv's test ones
        env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
        command[3:3] = ["-p", "xdist.plugin", "-p", "pytest_hud.plugin"]
    log = scratch / f"{name}.log"
    if tree != ROOT:  # a git ref's package: run in its tree (git_ref.tree_with_package)
        env = dict(env, PYTHONPATH=os.pathsep.join([str(tree), env.get("PYTHONPATH", "")]))
    if rerun:
        shutil.rmtree(scratch / ("cache-" + name), ignore_errors=True)
        run_timed(command, env, log, python_bin, tree)  # the first run: leaves the cache
    wall, code = run_timed(command, env, log, python_bin, tree)
    row = {"name": name, "command": " ".join(command[2:]), "wall_s": wall, "code": code, "log": log}
    row["startup"] = next((line for line in log.read_text().splitlines() if line.startswith("startup (")), None)
    if results.is_file():
        records = [json.loads(line) for line in results.read_text().splitlines()]
        episodes = {}
        for record in records:
            if record.get("outcome") in ("passed", "failed") and record.get("seed") is not None:
                env_success = (record.get("extra") or {}).get("env_success", record.get("success"))
                episodes[int(record["seed"])] = (bool(env_success), float(record.get("score") or 0.0))
        seeds = sorted(episodes)
        row["seeds"] = seeds
        row["successes"] = [episodes[s][0] for s in seeds]
        row["max_rewards"] = [episodes[s][1] for s in seeds]
        row["errors"] = sum(1 for record in records if record.get("outcome") == "error")
        row["videos"] = sum(1 for record in records if (record.get("artefacts") or {}).get("video"))
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--episodes", type=int, default=16)
    parser.add_argument("--width", type=int, default=8, help="-n and --hud-width; lerobot-eval's batch size")
    parser.add_argument("--python", type=Path, default=Path(sys.executable),
                        help="Interpreter of the LeRobot venv (lerobot-eval is taken from its bin/)")
    parser.add_argument(
        "--setups", nargs="+",
        default=["lerobot-eval", "hud", "hud-1thread", "hud-server", "lerobot-eval-96", "lerobot-eval"],
        choices=["lerobot-eval", "lerobot-eval-96", "hud", "hud-novideo", "hud-1thread", "hud-server", "hud-server-sync",
                 "hud-server-async", "hud-server-processes", "hud-server-processes-lockstep",
                 "hud-server-processes-ready", "hud-server-threads", "hud-server-ready", "hud-server-named", "hud-server-before",
                 "hud-before",
                 "hud-server-10videos", "hud-server-novideo", "hud-server-rerun", "hud-server-10videos-rerun"],
        help="What to run, in this order; repeats allowed (the ratio uses the median lerobot-eval wall time)")
    parser.add_argument("--before", default=None, metavar="REF",
                        help="Git ref whose pytest_hud the hud-server-before setup runs (the code before a change)")
    parser.add_argument("--keep", type=Path, default=None, help="Keep logs and outputs here")
    parser.add_argument("--all-plugins", action="store_true",
                        help="Let pytest load every plugin of this venv (by default only xdist and pytest-hud)")
    args = parser.parse_args(argv)
    if any(setup.endswith("-before") for setup in args.setups) != (args.before is not None):
        parser.error("--before REF and the hud-before or hud-server-before setup go together")

    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", SDL_VIDEODRIVER="dummy",
               PYGAME_HIDE_SUPPORT_PROMPT="1")
    # Both sides as users run Python: compiled modules cached. (Without it, every process of a
    # pytest-hud run, a -n 8 run has 13, compiles the editable package again, assert rewriting too,
    # while LeRobot's installed modules come compiled.)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    maker = load_maker()
    tick = time.perf_counter()
    checkpoint = maker.ensure_checkpoint(python=str(args.python))
    size = sum(p.stat().st_size for p in checkpoint.iterdir() if p.is_file())
    provenance = json.loads((checkpoint / maker.PROVENANCE_FILE).read_text())
    print(f"checkpoint: {checkpoint} ({provenance['policy']}, {provenance['parameters']:,} parameters, "
          f"{size / 1e6:.1f} MB; ready in {time.perf_counter() - tick:.1f}s, not timed)")
    last_seed = FIRST_SEED + args.episodes - 1
    print(f"episodes: {args.episodes} (seeds {FIRST_SEED}..{last_seed}), width {args.width}, max 300 steps, "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at start", flush=True)
    print("pytest plugins: " + ("every plugin of this venv (--all-plugins)" if args.all_plugins else
          "xdist and pytest-hud only (PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 -p xdist.plugin -p pytest_hud.plugin), "
          "what `pip install pytest-hud[lerobot]` brings; --all-plugins keeps this venv's others") + "\n",
          flush=True)

    scratch = Path(tempfile.mkdtemp(prefix="vs-lerobot-eval-"))
    rows = []
    try:
        before = None
        if args.before:
            before = tree_with_package(args.before, scratch / "before")
            check_package(str(args.python), before)
        setups = {
            "lerobot-eval": lambda name: lerobot_eval(args.python, checkpoint, args, scratch, env, name, []),
            "lerobot-eval-96": lambda name: lerobot_eval(
                args.python, checkpoint, args, scratch, env, name,
                ["--env.visualization_width=96", "--env.visualization_height=96"]),
            "hud": lambda name: pytest_hud(args.python, checkpoint, args, scratch, env, name, []),
            "hud-novideo": lambda name: pytest_hud(args.python, checkpoint, args, scratch, env, name,
                                                   ["--hud-video=none"]),
            "hud-1thread": lambda name: pytest_hud(args.python, checkpoint, args, scratch,
                                                   dict(env, OMP_NUM_THREADS="1"), name, []),
            "hud-server": lambda name: pytest_hud(args.python, checkpoint, args, scratch, env, name,
                                                  ["--hud-policy-server"]),
            "hud-server-sync": lambda name: pytest_hud(args.python, checkpoint, args, scratch, env, name,
                                                       ["--hud-policy-server", "--hud-vectorization=sync"]),
            "hud-server-async": lambda name: pytest_hud(args.python, checkpoint, args, scratch, env, name,
                                                        ["--hud-policy-server", "--hud-vectorization=async"]),
            "hud-server-processes": lambda name: pytest_hud(
                args.python, checkpoint, args, scratch, env, name,
                ["--hud-policy-server", "--hud-vectorization=processes"]),
            "hud-server-processes-lockstep": lambda name: pytest_hud(
                args.python, checkpoint, args, scratch, env, name,
                ["--hud-policy-server", "--hud-vectorization=processes", "--hud-tick=lockstep"]),
            "hud-server-processes-ready": lambda name: pytest_hud(
                args.python, checkpoint, args, scratch, env, name,
                ["--hud-policy-server", "--hud-vectorization=processes", "--hud-tick=ready"]),
            "hud-server-threads": lambda name: pytest_hud(args.python, checkpoint, args, scratch, env, name,
                                                          ["--hud-policy-server", "--hud-vectorization=threads"]),
            "hud-server-ready": lambda name: pytest_hud(args.python, checkpoint, args, scratch, env, name,
                                                        ["--hud-policy-server", "--hud-tick=ready"]),
            "hud-server-10videos": lambda name: pytest_hud(args.python, checkpoint, args, scratch, env, name,
                                                           ["--hud-policy-server", "--hud-video-max=10"]),
            "hud-server-novideo": lambda name: pytest_hud(args.python, checkpoint, args, scratch, env, name,
                                                          ["--hud-policy-server", "--hud-video=none"]),
            "hud-server-rerun": lambda name: pytest_hud(args.python, checkpoint, args, scratch, env, name,
                                                        ["--hud-policy-server"], rerun=True),
            "hud-server-10videos-rerun": lambda name: pytest_hud(args.python, checkpoint, args, scratch, env, name,
                                                                 ["--hud-policy-server", "--hud-video-max=10"],
                                                                 rerun=True),
            "hud-server-named": lambda name: pytest_hud(args.python, checkpoint, args, scratch, env, name,
                                                        ["--hud-policy-server", f"--hud-policy={checkpoint}"]),
            "hud-server-before": lambda name: pytest_hud(args.python, checkpoint, args, scratch, env, name,
                                                         ["--hud-policy-server"], before),
            "hud-before": lambda name: pytest_hud(args.python, checkpoint, args, scratch, env, name, [], before),
        }
        seen: dict[str, int] = {}
        for setup in args.setups:
            seen[setup] = seen.get(setup, 0) + 1
            name = setup if seen[setup] == 1 else f"{setup}#{seen[setup]}"
            row = setups[setup](name)
            row["setup"] = setup
            rows.append(row)
            n = len(row.get("successes", []))
            inner = f", in-process rollout {row['inner_s']:.1f}s" if "inner_s" in row else ""
            print(f"{name:16s} {row['wall_s']:7.1f}s wall (exit {row['code']}{inner}, load average "
                  f"{os.getloadavg()[0]:.1f} after)  {row['command']}", flush=True)
            if row.get("startup"):
                print(f"  {row['startup']}", flush=True)  # where its first seconds went
            if not n:
                print(f"  no per-episode results; log: {row['log']}")
                print("  " + "\n  ".join(Path(row["log"]).read_text().splitlines()[-15:]))

        print()
        reference = sorted(r["wall_s"] for r in rows if r["setup"] == "lerobot-eval" and r.get("successes"))
        base_wall = statistics.median(reference) if reference else None  # of the lerobot-eval runs
        base = next((r for r in rows if r["setup"] == "lerobot-eval" and r.get("successes")), None)
        if base_wall:
            print(f"reference: lerobot-eval wall {base_wall:.1f}s (median of {len(reference)} run(s))")
        for row in rows:
            if not row.get("successes"):
                continue
            n, k = len(row["successes"]), sum(row["successes"])
            mean_max = sum(row["max_rewards"]) / n
            ratio = ""
            if base_wall:
                ratio = f"  wall {row['wall_s']:6.1f}s, ratio {row['wall_s'] / base_wall:.2f}"
            errors = f", {row['errors']} errors" if row.get("errors") else ""
            videos = f", {row['videos']} videos" if row.get("videos") is not None else ""
            print(f"{row['name']:16s} success {rate_text(k, n)}; mean max reward {mean_max:.3f}"
                  f"{errors}{videos}{ratio}")
        if base:
            for row in rows:
                if row is base or not row.get("successes"):
                    continue
                theirs = dict(zip(base["seeds"], zip(base["successes"], base["max_rewards"])))
                ours = dict(zip(row["seeds"], zip(row["successes"], row["max_rewards"])))
                common = sorted(set(theirs) & set(ours))
                same_success = sum(theirs[s][0] == ours[s][0] for s in common)
                same_reward = sum(abs(theirs[s][1] - ours[s][1]) < 1e-6 for s in common)
                print(f"per seed, {row['name']} vs {base['name']}: {len(common)} common seeds, success "
                      f"equal on {same_success}, max reward equal (1e-6) on {same_reward}")
            if base.get("videos") is not None:
                print(f"lerobot-eval wrote {base['videos']} videos (always its first 10 episodes)")
    finally:
        if args.keep:
            shutil.copytree(scratch, args.keep, dirs_exist_ok=True)
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
