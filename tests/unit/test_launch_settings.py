"""The Ray options' rules and the static endpoint list, as plain function calls."""

from __future__ import annotations

import pytest

from pytest_hud.launch.launcher import LaunchError, StaticLauncher, parse_endpoints
from pytest_hud.core.settings import HudSettings, SettingsError, parse_resources


def build(**cli):
    return HudSettings.build(cli, {})


def test_resources_default_to_one_cpu_and_read_custom_ones():
    settings = build(ray="auto", bridge_resources='{"CPU": 2, "sim": 1}', policy_resources='{"GPU": 1}',
                     policy_server=True)
    assert settings.resources == {"bridge": {"CPU": 2.0, "sim": 1.0}, "policy": {"GPU": 1.0}}
    assert build(ray="auto").resources == {"bridge": {"CPU": 1.0}, "policy": {"CPU": 1.0}}


@pytest.mark.parametrize("text, says", [
    ("{sim: 1}", "must be a JSON object such as"),
    ('["sim"]', "must be a JSON object of resource names"),
    ('{"sim": -1}', "resource 'sim' needs a non-negative number"),
    ('{"sim": true}', "resource 'sim' needs a non-negative number"),
])
def test_bad_resources_name_the_option(text, says):
    with pytest.raises(SettingsError, match="--hud-bridge-resources") as info:
        build(ray="auto", bridge_resources=text)
    assert says in str(info.value)


def test_resources_without_ray_and_ray_with_an_attached_bridge_are_refused():
    with pytest.raises(SettingsError, match="add --hud-ray ADDRESS"):
        build(policy_resources='{"GPU": 1}')
    with pytest.raises(SettingsError, match="pass one of them"):
        build(ray="auto", sim_url="bridge.json")
    with pytest.raises(SettingsError, match="--hud-ray needs an address"):
        build(ray="  ")


def test_replicas_and_lease_are_checked():
    with pytest.raises(SettingsError, match="--hud-policy-replicas must be at least 1"):
        build(policy_replicas=0)
    with pytest.raises(SettingsError, match="--hud-lease must be positive"):
        build(lease=0)
    assert build(policy_server=True, policy_replicas=3, lease=2.5).policy_replicas == 3


def test_policy_server_options_without_a_policy_server_are_refused():
    with pytest.raises(SettingsError, match="--hud-policy-replicas is about policy servers: add --hud-policy-server"):
        build(policy_replicas=2)
    with pytest.raises(SettingsError, match="--hud-policy-resources is about policy servers"):
        build(ray="auto", policy_resources='{"GPU": 1}')


def test_parse_resources_default():
    assert parse_resources(None, "--hud-policy-resources") == {"CPU": 1.0}


def test_endpoints_from_triples_need_the_secret_and_files_must_exist(tmp_path):
    assert parse_endpoints("h:1:2, ", "s") == [{"host": "h", "control": 1, "ws": 2, "secret": "s", "node": "h"}]
    with pytest.raises(LaunchError, match="set PYTEST_HUD_SECRET"):
        parse_endpoints("h:1:2", None)
    with pytest.raises(LaunchError, match="does not exist"):
        parse_endpoints(str(tmp_path / "missing.json"), "s")
    (tmp_path / "b.json").write_text('{"control": 5, "ws": 6, "secret": "t"}')
    assert parse_endpoints(str(tmp_path / "b.json"), None)[0]["host"] == "127.0.0.1"


def test_a_static_launcher_hands_out_endpoints_in_turn_then_says_which_variable_to_extend():
    launcher = StaticLauncher({"PYTEST_HUD_BRIDGES": "a:1:2,b:3:4", "PYTEST_HUD_SECRET": "s",
                               "PYTEST_HUD_POLICY_SERVERS": "ws://gpu1:8000"})
    launch = dict(role="bridge", env={}, timeout=1.0)
    assert [launcher.launch([], "bridge", **launch).announce["host"] for _ in range(2)] == ["a", "b"]
    with pytest.raises(LaunchError, match=r"endpoint #3 but \$PYTEST_HUD_BRIDGES lists 2"):
        launcher.launch([], "bridge", **launch)
    policy = launcher.launch([], "policy server", role="policy", env={}, timeout=1.0)
    assert policy.announce == {"url": "ws://gpu1:8000", "host": "gpu1", "key": None} and policy.poll() is None


def test_a_bridge_holds_starts_for_the_workers_that_share_it():
    from pytest_hud.controller.pool import BridgeSpec, SimPool

    def sharing(workers: int, width: int) -> list[int]:
        pool = SimPool("s", BridgeSpec(width=width), workers=workers)
        return [pool.bridge_set._sharing(pool.bridge_set.group_of(w)) for w in range(workers)]

    assert sharing(8, 8) == [8] * 8
    assert sharing(8, 4) == [4] * 8  # two bridges of four
    assert sharing(5, 4) == [4] * 4 + [1]  # the second bridge has one worker: nothing to wait for
    assert sharing(2, 8) == [2, 2]


@pytest.mark.parametrize("vectorization, width, cores, env, threads", [
    ("auto", 8, 2, {}, 1),  # two env processes fill both cores: one thread for a forward
    ("processes", 8, 16, {}, 9),  # eight env processes on 16 cores: the other eight, plus one
    ("processes", 2, 2, {}, 1),
    ("auto", 1, 2, {}, None),  # one env: no process of its own, torch's default
    ("sync", 8, 2, {}, None),  # envs in the bridge's process: torch's default
    ("auto", 8, 2, {"OMP_NUM_THREADS": "2"}, None),  # the user decided
])
def test_a_local_policy_server_leaves_the_env_processes_their_cores(monkeypatch, vectorization, width, cores, env,
                                                                    threads):
    from pytest_hud.controller.pool import BridgeSpec, SimPool

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr("os.cpu_count", lambda: cores)
    pool = SimPool("s", BridgeSpec(width=width, vectorization=vectorization), workers=8)
    assert pool.server_threads() == threads
    assert ("--threads" in pool.server_set._server_cmd("ckpt")) == (threads is not None)
    assert SimPool("s", BridgeSpec(width=width, vectorization=vectorization), workers=8,
                   launcher=StaticLauncher({})).server_threads() is None  # not started on this machine


def test_a_policy_server_is_started_with_its_tests_rename_else_the_options():
    import json

    from pytest_hud.controller.pool import BridgeSpec, SimPool

    pool = SimPool("s", BridgeSpec(width=1, policy_rename={"joints": "observation.state"}), workers=1)
    option = pool.server_set._server_cmd("ckpt")
    assert json.loads(option[option.index("--rename") + 1]) == {"joints": "observation.state"}
    marked = pool.server_set._server_cmd("ckpt", {"arm": "observation.state"})
    assert json.loads(marked[marked.index("--rename") + 1]) == {"arm": "observation.state"}
    assert "--rename" not in pool.server_set._server_cmd("ckpt", {})
