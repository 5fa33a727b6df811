"""Settings: one table, one precedence rule, derived timeouts; plain function calls."""

from __future__ import annotations

import pytest

from pytest_hud.core.settings import OPTIONS, HudSettings, SettingsError, Timeouts, rename_problem

NONE = {name: None for name in OPTIONS}


def build(cli=None, ini=None, **kw) -> HudSettings:
    return HudSettings.build({**NONE, **(cli or {})}, {**NONE, **(ini or {})}, **kw)


def test_defaults_come_from_the_one_table():
    s = build()
    for name, opt in OPTIONS.items():
        assert getattr(s, name) == opt.default, name


def test_command_line_beats_ini_and_ini_strings_are_converted():
    s = build(cli={"step_timeout": 5.0}, ini={"step_timeout": "7", "boot_timeout": "60", "sequential": "true"})
    assert s.step_timeout == 5.0 and s.boot_timeout == 60.0 and s.sequential is True


@pytest.mark.parametrize("cli, ini, message", [
    ({"width": 0}, {}, "--hud-width must be at least 1, got 0"),
    ({}, {"step_timeout": "-1"}, "--hud-step-timeout must be positive"),
    ({"video": "some"}, {}, "--hud-video must be none, failed or all, got 'some'"),
    ({}, {"vectorization": "fibers"}, "--hud-vectorization must be auto, sync, async, processes or threads, got 'fibers'"),
    ({"tick": "fast"}, {}, "--hud-tick must be auto, lockstep, ready or lanes, got 'fast'"),
    ({}, {"tick_window": "-0.001"}, "--hud-tick-window must be zero or more, got -0.001"),
    ({}, {"width": "eight"}, "ini key hud_width = 'eight' is not a valid int"),
    ({}, {"sequential": "maybe"}, "ini key hud_sequential = 'maybe' is not a boolean"),
])
def test_bad_values_name_the_option_and_what_it_accepts(cli, ini, message):
    with pytest.raises(SettingsError, match=message.replace("(", r"\(").replace(")", r"\)")):
        build(cli=cli, ini=ini)


def test_policy_on_the_command_line_beats_the_marker_which_beats_the_ini():
    marks = {"policy": "marker:p", "sim": "marker:sim", "max_steps": 7}
    assert build(ini={"policy": "ini:p"}).for_item(marks).policy == "marker:p"
    assert build(cli={"policy": "cli:p"}, ini={"policy": "ini:p"}).for_item(marks).policy == "cli:p"
    assert build(ini={"policy": "ini:p"}).for_item({}).policy == "ini:p"


def test_the_marker_beats_the_options_for_sim_max_steps_build_and_floor():
    s = build(cli={"sim": "cli:sim", "max_steps": 100})
    item = s.for_item({"sim": "marker:sim", "max_steps": 7, "build": {"task": "a"}, "min_success": 0.5})
    assert (item.sim, item.max_steps, item.build, item.min_success) == ("marker:sim", 7, {"task": "a"}, 0.5)
    plain = s.for_item({})
    assert (plain.sim, plain.max_steps, plain.build, plain.min_success) == ("cli:sim", 100, {}, None)


def test_settings_cross_the_xdist_channel_as_builtins():
    s = build(cli={"policy": "cli:p", "width": 4}, workers=8, distributed=True)
    again = HudSettings.from_dict(s.to_dict())
    assert again == s and again.slots == 4 and again.policy_cli == "cli:p"
    assert build(workers=3).slots == 3


def test_clients_always_wait_longer_than_the_bridge_they_wait_on():
    t = build(cli={"first_action_timeout": 50.0, "step_timeout": 2.0, "boot_timeout": 10.0}).timeouts
    assert t == Timeouts(boot=10.0, first_action=50.0, step=2.0)
    assert t.recv > t.first_action + t.step
    assert t.pool_call > t.boot


def test_the_marker_rename_merges_over_the_option_and_wins_for_a_key_both_name():
    s = build({"policy_rename": "agentview_image=observation.images.a,state=observation.state"})
    item = s.for_item({"rename": {"agentview_image": "observation.images.image",
                                  "robot0_eye_in_hand_image": "observation.images.image2"}})
    assert item.rename == {"agentview_image": "observation.images.image", "state": "observation.state",
                           "robot0_eye_in_hand_image": "observation.images.image2"}
    assert s.for_item({}).rename == {"agentview_image": "observation.images.a", "state": "observation.state"}
    assert build().for_item({}).rename == {}


@pytest.mark.parametrize("rename, message", [
    ("agentview_image=observation.images.image", "must be a dict of observation key -> LeRobot input feature"),
    ({"agentview_image": ""}, "'agentview_image': '' is not a pair of names"),
    ({"agentview_image": 3}, "'agentview_image': 3 is not a pair of names"),
])
def test_a_bad_marker_rename_names_the_problem_and_an_example(rename, message):
    problem = rename_problem(rename)
    assert message in problem and "e.g. rename={'agentview_image'" in problem
    assert build({"policy_rename": "a=b"}).for_item({"rename": rename}).rename == {"a": "b"}  # left out
    assert rename_problem({"agentview_image": "observation.images.image"}) is None


def test_video_max_is_at_least_one_and_names_the_way_to_no_videos():
    from pytest_hud.core.settings import HudSettings, SettingsError

    assert HudSettings.build({"video_max": 3}, {}).video_max == 3
    assert HudSettings.build({}, {"video_max": "2"}).video_max == 2
    assert HudSettings.build({}, {}).video_max is None
    with pytest.raises(SettingsError, match="--hud-video-max must be at least 1"):
        HudSettings.build({"video_max": 0}, {})


def test_a_recorder_alone_counts_its_own_videos_per_task_and_takes_back_the_unneeded(tmp_path):
    pytest.importorskip("av", reason="videos need PyAV")
    from types import SimpleNamespace

    from pytest_hud.recording.video import VideoRecorder

    recorder = VideoRecorder(tmp_path, "failed", max_per_task=1)
    episode = SimpleNamespace(seed=1, contract=None)
    recorder.label_next("t::a", "1")
    assert recorder.wants_episode(episode)
    recorder.label_next("t::a", "2")  # (a second recorder call before the first ended: the limit holds)
    assert not recorder.wants_episode(episode) and not recorder.wants_replay(None, "error")
    recorder.on_end(episode, None, "error")  # refused: nothing to give back
    recorder.label_next("t::b", "1")
    assert recorder.wants_episode(episode)  # another task has its own
    recorder.on_end(episode, SimpleNamespace(success=True, artefacts={}), None)  # succeeded: given back
    recorder.label_next("t::b", "2")
    assert recorder.wants_episode(episode) and recorder.wants_replay(None, "error")
    with pytest.raises(ValueError, match="max_per_task=0"):
        VideoRecorder(tmp_path, "failed", max_per_task=0)
    recorder.close()


def test_the_shared_video_quota_gives_back_what_a_dead_worker_took_and_nothing_twice():
    from pytest_hud.recording.quota import VideoQuota

    quota = VideoQuota(2)
    assert quota("a", "take", "gw0") and quota("a", "take", "gw1")
    assert not quota("a", "take", "gw2")  # the limit holds across workers
    quota("a", "keep", "gw0")  # gw0's episode makes its video
    assert quota.release("gw0") == 0  # kept: nothing to give back when gw0 dies later
    assert quota.release("gw1") == 1  # gw1 died mid-episode: its video goes to a later episode
    assert quota("a", "take", "gw3")
    quota("a", "give_back", "gw3")
    quota("a", "give_back", "gw3")  # a second give-back of one take changes nothing
    assert quota("a", "take", "gw3") and not quota("a", "take", "gw4")
    assert quota.release("gw3") == 1 and quota("b", "take", "gw4")  # each task has its own
    with pytest.raises(ValueError, match="'drop'"):
        quota("a", "drop", "gw4")
