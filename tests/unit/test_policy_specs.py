"""What a bad ``--hud-policy`` says: the spec's kind, and what a would-be checkpoint lacks."""

from __future__ import annotations

import json

import pytest

from pytest_hud.agent.model import PolicyError, check_policy_spec, load_policy


def test_a_path_that_is_no_checkpoint_says_what_it_lacks(tmp_path):
    no_weights, no_type, transformers = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    for folder in (no_weights, no_type, transformers):
        folder.mkdir()
    (no_weights / "config.json").write_text(json.dumps({"type": "act"}))
    for folder, config in ((no_type, {}), (transformers, {"model_type": "bert"})):
        (folder / "config.json").write_text(json.dumps(config))
        (folder / "model.safetensors").write_bytes(b"")
    cases = {
        tmp_path / "nope" / "final": "does not exist",
        no_weights: "has no model.safetensors",
        tmp_path / "empty": "has no config.json and no model.safetensors",
        no_weights / "config.json": "is a file, not a checkpoint directory",
        no_type: 'config.json\' names no policy "type"',
        transformers: 'names no policy "type"',
    }
    (tmp_path / "empty").mkdir()
    for path, why in cases.items():
        with pytest.raises(PolicyError, match="is neither 'module:factory'") as caught:
            check_policy_spec(str(path))
        assert why in str(caught.value), (path, str(caught.value))


def test_a_factory_that_cannot_be_found_says_which_part_is_missing(tmp_path):
    with pytest.raises(PolicyError, match="no module 'nosuchmod' is importable here"):
        load_policy("nosuchmod:make", None)
    missing = tmp_path / "nope.py"
    with pytest.raises(PolicyError, match=f"policy file '{missing}' does not exist"):
        load_policy(f"{missing}:make", None)
    (tmp_path / "pols.py").write_text("thing = 3\n")
    with pytest.raises(PolicyError, match="does not name a callable factory"):
        load_policy(f"{tmp_path / 'pols.py'}:thing", None)


def _checkpoint(folder):
    folder.mkdir()
    (folder / "config.json").write_text('{"type": "act"}')
    (folder / "model.safetensors").write_bytes(b"\0" * 4096)
    (folder / "sub").mkdir()
    (folder / "sub" / "extra.bin").write_bytes(b"\1\2\3")
    return folder


def test_a_checkpoint_hash_covers_each_file_name_and_content_in_order(tmp_path):
    import hashlib

    from pytest_hud.agent.model import policy_content_hash, policy_files

    folder = _checkpoint(tmp_path / "ckpt")
    files = policy_files(str(folder))
    assert files == sorted(str(p) for p in folder.rglob("*") if p.is_file())
    want = hashlib.sha256()
    for f in sorted(p for p in folder.rglob("*") if p.is_file()):
        want.update(f.name.encode() + f.read_bytes())
    assert policy_content_hash(str(folder)) == "sha256:" + want.hexdigest()
    before = policy_content_hash(str(folder))
    (folder / "sub" / "extra.bin").write_bytes(b"\1\2\4")
    assert policy_content_hash(str(folder)) != before


def test_a_symlinked_checkpoint_file_is_hashed_under_its_own_name(tmp_path):
    # (a hub cache's snapshot folder holds links to blobs named by their hash)
    from pytest_hud.agent.model import policy_content_hash

    plain = _checkpoint(tmp_path / "plain")
    linked = tmp_path / "linked"
    linked.mkdir()
    blobs = tmp_path / "blobs"
    blobs.mkdir()
    for f in plain.rglob("*"):
        if f.is_file():
            blob = blobs / f"blob-{f.name}"
            blob.write_bytes(f.read_bytes())
            (linked / f.relative_to(plain)).parent.mkdir(parents=True, exist_ok=True)
            (linked / f.relative_to(plain)).symlink_to(blob)
    assert policy_content_hash(str(linked)) == policy_content_hash(str(plain))


def test_policy_files_of_what_has_no_files_is_none(tmp_path):
    from pytest_hud.agent.model import policy_files

    assert policy_files("ws://127.0.0.1:1") is None
    assert policy_files("no_such_module_anywhere:make") is None
    assert policy_files(str(tmp_path / "missing")) is None  # neither a checkpoint nor a factory
    (tmp_path / "pol.py").write_text("def make():\n    return None\n")
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "w.bin").write_bytes(b"w")
    assert policy_files(f"{tmp_path / 'pol.py'}:make") == [str(tmp_path / "pol.py"),
                                                           str(tmp_path / "checkpoints" / "w.bin")]


def test_the_controller_hashes_a_policy_once_however_many_workers_ask(tmp_path, monkeypatch):
    from concurrent.futures import ThreadPoolExecutor

    import pytest_hud.agent.model as model
    import pytest_hud.core.specs as specs
    from pytest_hud.controller.provenance import PolicyHashes

    folder = _checkpoint(tmp_path / "ckpt")
    calls = []
    real = specs.hash_files

    def counting(files, stop=None):
        calls.append(tuple(files))
        return real(files, stop)

    monkeypatch.setattr(specs, "hash_files", counting)  # what the controller hashes with
    files = model.policy_files(str(folder))
    hashes = PolicyHashes()
    try:
        hashes.start(str(folder), files)  # a worker's declaration
        with ThreadPoolExecutor(8) as pool:  # eight workers' first records
            got = list(pool.map(lambda _: hashes.get(str(folder), list(files)), range(8)))
        assert got == [real(files)] * 8
        assert calls == [tuple(files)]
        # Without files (a ws:// server) or without a policy: None, and nothing is read.
        assert hashes.get("ws://127.0.0.1:1", None) is None and hashes.get(None, None) is None
        # A file that cannot be read: None (never reused by --hud-resume), not an error.
        assert hashes.get("gone", [str(tmp_path / "gone.bin")]) is None
        assert len(calls) == 2
    finally:
        hashes.close()


def test_closing_the_hashes_stops_a_long_read_at_once(tmp_path, monkeypatch):
    import threading
    import time

    import pytest_hud.core.specs as specs
    from pytest_hud.controller.provenance import PolicyHashes

    big = tmp_path / "weights.bin"
    big.write_bytes(b"\0" * (4 << 20))  # four blocks
    reading = threading.Event()
    real_update = specs.hashlib.sha256

    class Slow:  # a sha256 that takes a second per block, as a gigabyte file would in all
        def __init__(self):
            self.h = real_update()

        def update(self, data):
            reading.set()
            time.sleep(1.0 if len(data) > 100 else 0)
            self.h.update(data)

        def hexdigest(self):
            return self.h.hexdigest()

    monkeypatch.setattr(specs.hashlib, "sha256", Slow)
    hashes = PolicyHashes()
    future = hashes.start("ckpt", [str(big)])
    assert reading.wait(5)
    started = time.monotonic()
    hashes.close()
    assert future.result(timeout=3) is None  # stopped within a block, not after all four
    assert time.monotonic() - started < 2.5
