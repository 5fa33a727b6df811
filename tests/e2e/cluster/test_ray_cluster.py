"""Bridges and policy servers placed on a real Ray cluster (several nodes on this host).

One module-scoped ``ray.cluster_utils.Cluster``: a head without custom resources, a node with
``{"sim": 4}`` and a node with ``{"policy": 2}``. Each test runs a real pytest-hud eval in a
subprocess (the controller is the Ray driver) and checks what Ray placed from node ids, what the
results file says, and which processes are left. The tests that destroy nodes run last.

Run with ``tox -e ray`` (or ``pytest tests/e2e/cluster``); skipped where Ray is not installed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install 'pytest-hud[ray]' (tox -e ray)")
psutil = pytest.importorskip("psutil")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
SLEEPY = HERE / "suite" / "suite_sleepy.py"
CARTPOLE = HERE / "suite" / "suite_cartpole.py"

# On a loopback-only cluster the driver must not dial the machine's external address.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"


class Nodes:
    def __init__(self, cluster, sim, policy) -> None:
        self.cluster, self.sim, self.policy = cluster, sim, policy
        self.address = cluster.address


@pytest.fixture(scope="module")
def nodes():
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "include_dashboard": False,
        # Notice a dead raylet in seconds, not the default half minute.
        "_system_config": {"health_check_period_ms": 500, "health_check_failure_threshold": 4},
    })
    try:
        sim = cluster.add_node(num_cpus=2, resources={"sim": 4})
        policy = cluster.add_node(num_cpus=1, resources={"policy": 2})
        cluster.wait_for_nodes()
        yield Nodes(cluster, sim, policy)
    finally:
        cluster.shutdown()


def hud_env(**extra: str) -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(REPO), SDL_VIDEODRIVER="dummy", **extra)


def pytest_cmd(suite: Path, tmp_path: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "pytest", str(suite), "-p", "no:cacheprovider", "-p", "no:randomly",
            "--rootdir", str(tmp_path), "-q", "-n", "2", "--hud-width", "2",
            "--hud-results", str(tmp_path / "results.jsonl"), *args]


def ray_args(nodes: Nodes, policy: bool = False) -> list[str]:
    args = ["--hud-ray", nodes.address, "--hud-bridge-resources", '{"sim": 1}']
    if policy:
        args += ["--hud-policy-server", "--hud-policy-resources", '{"policy": 1}', "--hud-policy-replicas", "2"]
    return args


def episodes(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if data.get("record") == "episode":
            out.append(data)
    return out


def run(suite: Path, tmp_path: Path, *args: str, **env: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
    proc = subprocess.run(pytest_cmd(suite, tmp_path, *args), cwd=tmp_path, env=hud_env(**env),
                          capture_output=True, text=True, timeout=400)
    return proc, episodes(tmp_path / "results.jsonl")


def eventually(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not (value := condition()):
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:.0f} s: {what}")
        time.sleep(0.1)
    return value


def placed_processes() -> dict[int, str]:
    """Every ServiceActor process on this host and its children (the bridges and policy servers)."""
    found: dict[int, str] = {}
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if "ServiceActor" in cmdline:
            found[proc.pid] = "actor"
            try:
                for child in proc.children(recursive=True):
                    found[child.pid] = " ".join(child.cmdline())
            except psutil.Error:
                pass
    return found


def alive(pids) -> list[int]:
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def start_run(suite: Path, tmp_path: Path, *args: str, **env: str) -> subprocess.Popen:
    return subprocess.Popen(pytest_cmd(suite, tmp_path, *args), cwd=tmp_path, env=hud_env(**env),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)


def kill_run(proc: subprocess.Popen) -> None:
    """SIGKILL the pytest controller and then its xdist workers (they are not under test here)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(30)


# --------------------------------------------------------------------------- placement
def test_services_land_on_their_nodes_and_results_equal_a_local_run(nodes, tmp_path):
    (tmp_path / "local").mkdir()
    (tmp_path / "ray").mkdir()
    local, local_records = run(CARTPOLE, tmp_path / "local", "--hud-policy-server")
    placed, ray_records = run(CARTPOLE, tmp_path / "ray", *ray_args(nodes, policy=True))
    assert placed.returncode == 0, placed.stdout[-3000:] + placed.stderr[-2000:]
    assert local.returncode == 0, local.stdout[-3000:]

    assert len(ray_records) == 6
    for record in ray_records:
        assert record["extra"]["bridge_node"] == nodes.sim.node_id, record
        assert record["extra"]["policy_node"] == nodes.policy.node_id, record
    assert {r["extra"]["policy_replica"] for r in ray_records} == {0, 1}  # workers spread over replicas
    assert all("bridge_node" not in r.get("extra", {}) for r in local_records)

    def per_episode(records):
        return {r["seed"]: (r["outcome"], r["success"], r["steps"], r["total_reward"]) for r in records}

    assert per_episode(ray_records) == per_episode(local_records)


def test_resources_no_node_offers_are_a_clear_error(nodes, tmp_path):
    proc, records = run(SLEEPY, tmp_path, "--hud-ray", nodes.address, "--hud-bridge-resources", '{"tpu": 1}',
                        HUD_SUITE_EPISODES="2")
    assert proc.returncode != 0
    assert [r["outcome"] for r in records] == ["error", "error"], proc.stdout[-3000:]
    for record in records:
        assert "no live node of the Ray cluster offers" in record["error"], record
        assert "--hud-bridge-resources" in record["error"], record


# ------------------------------------------------------------------------ node loss
def test_a_lost_node_errors_its_episodes_by_name_and_a_replacement_finishes_the_run(nodes, tmp_path):
    spare = nodes.cluster.add_node(num_cpus=2, resources={"sim": 4})
    nodes.cluster.wait_for_nodes()
    results = tmp_path / "results.jsonl"
    proc = start_run(SLEEPY, tmp_path, *ray_args(nodes), HUD_SUITE_EPISODES="16", HUD_SUITE_LENGTH="40",
                     HUD_SUITE_SLEEP_MS="25")
    try:
        eventually(lambda: len(episodes(results)) >= 2, 180, "two episodes finished")
        lost_id = episodes(results)[0]["extra"]["bridge_node"]
        lost = {nodes.sim.node_id: nodes.sim, spare.node_id: spare}[lost_id]
        nodes.cluster.remove_node(lost, allow_graceful=False)
        nodes.sim = spare if lost is nodes.sim else nodes.sim  # what later tests may use
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            kill_run(proc)
    records = episodes(results)
    assert sorted(r["seed"] for r in records) == list(range(16)), out[-3000:]  # nothing lost
    errors = [r for r in records if r["outcome"] == "error"]
    assert errors, out[-3000:]
    for record in errors:
        assert lost_id in record["error"] and record["extra"]["bridge_node"] == lost_id, record
    graded = [r for r in records if r["outcome"] != "error"]
    assert any(r["extra"]["bridge_node"] == nodes.sim.node_id for r in graded), "no episode ran on the replacement"
    for record in graded:
        assert record["success"] == (record["seed"] % 2 == 1), record


# ------------------------------------------------------------------ controller death
def test_sigkill_of_the_controller_leaves_no_actor_bridge_or_policy_server(nodes, tmp_path):
    assert placed_processes() == {}, "a previous test left placed processes"
    proc = start_run(SLEEPY, tmp_path, *ray_args(nodes, policy=True), HUD_SUITE_EPISODES="40",
                     HUD_SUITE_LENGTH="40", HUD_SUITE_SLEEP_MS="25")
    try:
        eventually(lambda: len(episodes(tmp_path / "results.jsonl")) >= 1, 180, "an episode finished")

        def all_placed() -> dict[int, str]:  # one bridge, two policy replicas (one per worker), their actors
            found = placed_processes()
            kinds = list(found.values())
            complete = (kinds.count("actor") == 3 and sum("pytest_hud.bridge" in k for k in kinds) == 1
                        and sum("pytest_hud.serving" in k for k in kinds) == 2)
            return found if complete else {}

        before = eventually(all_placed, 120, "a bridge, two policy replicas and their three actors")
        os.kill(proc.pid, signal.SIGKILL)
        eventually(lambda: not alive(before), 30, f"placed processes gone; left: {alive(before)}")
    finally:
        kill_run(proc)


def test_a_crashed_raylet_with_a_silent_controller_still_leaves_nothing_running(nodes, tmp_path):
    """The hole Ray leaves: actor and bridge outlive a crashed raylet. The lease closes it."""
    proc = start_run(SLEEPY, tmp_path, *ray_args(nodes), "--hud-lease", "3", HUD_SUITE_EPISODES="40",
                     HUD_SUITE_LENGTH="40", HUD_SUITE_SLEEP_MS="25")
    try:
        eventually(lambda: len(episodes(tmp_path / "results.jsonl")) >= 1, 180, "an episode finished")
        before = placed_processes()
        bridges = [pid for pid, what in before.items() if "pytest_hud.bridge" in what]
        assert len(bridges) == 1, before
        announce = before[bridges[0]].split("--announce ")[1].split()[0]
        log = Path(announce).with_name("service.log")
        raylet = nodes.sim.all_processes[ray._private.ray_constants.PROCESS_TYPE_RAYLET][0].process
        # Freeze the controller first: it can neither renew the lease nor close it, nor tell Ray.
        os.kill(proc.pid, signal.SIGSTOP)
        raylet.kill()
        eventually(lambda: not alive(before), 60, f"placed processes gone; left: {alive(before)}")
        assert "lease expired" in log.read_text()
    finally:
        try:
            os.kill(proc.pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
        kill_run(proc)
