"""Drills: who may talk to a bridge (DESIGN §9): the control channel's secret, tokens of another run
or released or graded, the listening addresses, and no unsafe deserialization in the package.
"""

from __future__ import annotations

import ast
import json
import os
import reprlib
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import psutil
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect as ws_connect

from conftest import SIMKIT, start_bridge
from pytest_hud.client.bridge import BridgeAddress, BridgeError, ControlClient, SlotClient
from pytest_hud.core.contract import Contract
from pytest_hud.wire.codec import MAX_FRAME_BYTES, WireError, packb, unpackb

from fuzzkit import CASES, FUZZ, PEER_SEED, WAIT, WIDTH, Conn, Peer, Target, sims  # noqa: F401 - sims: the module's bridges (a fixture)

pytestmark = pytest.mark.timeout(180)

# ============================================================================ access
@pytest.fixture(scope="module")
def two_runs(sims) -> tuple[Target, Target]:
    """Two bridges with their own secrets, as two pytest runs on one machine would have."""
    return sims(2), sims(2)


def _hello(address: BridgeAddress, params: dict | None) -> tuple[dict | None, dict | None]:
    """Send one first call; return (its reply, what came next: None when the bridge closed)."""
    conn = Conn(address, hello=False)
    try:
        if params is None:
            conn.send_obj({"jsonrpc": "2.0", "id": 1, "method": "stats", "params": {}})
        else:
            conn.send_obj({"jsonrpc": "2.0", "id": 1, "method": "hello", "params": params})
        reply = conn.read()
        conn.send_obj({"jsonrpc": "2.0", "id": 2, "method": "stats", "params": {}})
        return reply, conn.read()
    finally:
        conn.close()


@pytest.mark.parametrize("params", [
    None,  # no hello at all
    {},
    {"secret": None},
    {"secret": ""},
    {"secret": 12345},
    {"secret": ["$secret"]},
    {"secret": "$other"},  # the other run's secret
    {"secret": "$secret[:-1]"},
    {"secret": "$secret+0"},
    {"secret": "$one-off"},
], ids=["no-hello", "no-params", "null", "empty", "number", "list", "other-run", "prefix", "longer",
        "one-char-off"])
def test_the_control_channel_refuses_a_wrong_or_missing_secret(two_runs, params):
    run_a, run_b = two_runs
    secret = run_a.address.secret
    forged = {"$secret": secret, "$other": run_b.address.secret, "$secret[:-1]": secret[:-1],
              "$secret+0": secret + "0", "$one-off": ("1" if secret[0] == "0" else "0") + secret[1:]}
    if params is not None:
        params = {k: ([forged.get(x, x) for x in v] if isinstance(v, list) else forged.get(v, v))
                  for k, v in params.items()}
    reply, after = _hello(run_a.address, params)
    assert reply["error"]["code"] == -32001, reply
    assert "secret" in reply["error"]["message"] or "hello" in reply["error"]["message"]
    assert after is None, f"the connection stayed open after a refused first call: {after}"
    ok, more = _hello(run_a.address, {"secret": secret})
    assert ok["result"]["width"] == 2 and "result" in more  # the right secret still works


def test_tokens_from_another_run_released_or_graded_tokens_are_refused(two_runs):
    run_a, run_b = two_runs
    with ControlClient(run_a.address) as a, ControlClient(run_b.address) as b:
        from_b = b.reset(seed=1, wait=WAIT).token
        released = a.reset(seed=2, wait=WAIT).token
        a.release(released)
        graded = a.reset(seed=3, wait=WAIT).token
        a.result(graded)
        for token, why in [(from_b, "another run"), (released, "released"), (graded, "graded")]:
            with pytest.raises(BridgeError, match="unknown or released token"):
                SlotClient(run_a.address, token, connect_timeout=WAIT, recv_timeout=WAIT)
            with pytest.raises(BridgeError, match="unknown or released token"):
                a.result(token)
            with pytest.raises(BridgeError, match="unknown or released token"):
                a.release(token)
        # a live token of this run, used from another connection of the same run, is refused too
        mine = a.reset(seed=4, wait=WAIT).token
        with ControlClient(run_a.address) as other:
            with pytest.raises(BridgeError, match="minted on another connection"):
                other.result(mine)
        a.release(mine)
        b.release(from_b)
    run_a.assert_healthy()
    run_b.assert_healthy()


def _listening(pid: int) -> list[tuple[str, int]]:
    return [(c.laddr.ip, c.laddr.port) for c in psutil.Process(pid).net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN]


def test_bridges_and_the_pool_listen_on_loopback_only_by_default(tmp_path):
    from pytest_hud.controller.pool import BridgeSpec, SimPool
    from pytest_hud.controller.pool_service import PoolService

    process, address = start_bridge(tmp_path, f"{SIMKIT}:counter", 1)
    try:
        announce = next(tmp_path.glob("bridge-*.json"))
        assert announce.stat().st_mode & 0o777 == 0o600  # it holds the secret
        assert address.host == "127.0.0.1"
        assert sorted(_listening(process.pid)) == sorted([("127.0.0.1", address.control),
                                                          ("127.0.0.1", address.ws)])
    finally:
        process.terminate()
        process.wait(10)
    pool = SimPool("s" * 32, BridgeSpec(width=1))
    service = PoolService(pool, "s" * 32)
    try:
        spawned = pool.bridge_for(f"{SIMKIT}:counter", {})
        assert spawned.host == "127.0.0.1"
        assert sorted(_listening(spawned.pid)) == sorted([("127.0.0.1", spawned.control),
                                                          ("127.0.0.1", spawned.ws)])
        assert ("127.0.0.1", service.port) in _listening(os.getpid())
        assert all(ip == "127.0.0.1" for ip, port in _listening(os.getpid()) if port == service.port)
    finally:
        service.close()
        pool.stop_all()
    assert not pool.workdir.exists()  # the announce files (with the secret) went with it


# ----------------------------------------------------------- no unpickling on input paths
UNSAFE_MODULES = {"pickle", "_pickle", "cPickle", "dill", "cloudpickle", "shelve", "marshal", "jsonpickle",
                  "joblib"}
UNSAFE_YAML = {"load", "load_all", "unsafe_load", "unsafe_load_all", "full_load", "full_load_all"}
SAFE_LOADERS = {"SafeLoader", "CSafeLoader", "BaseLoader", "CBaseLoader"}


def _dotted(node: ast.AST, aliases: dict[str, str]) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(aliases.get(node.id, node.id))
    return ".".join(reversed(parts))


def _kw(call: ast.Call, name: str) -> ast.AST | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def unsafe_deserialisation(source: str) -> list[str]:
    """Every way ``source`` could unpickle or build arbitrary objects from input, by its syntax tree."""
    tree = ast.parse(source)
    aliases: dict[str, str] = {}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
                if a.name.split(".")[0] in UNSAFE_MODULES:
                    found.append(f"line {node.lineno}: import {a.name}")
        elif isinstance(node, ast.ImportFrom):
            mod = (node.module or "").split(".")[0]
            for a in node.names:
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"
            if mod in UNSAFE_MODULES:
                found.append(f"line {node.lineno}: from {node.module} import ...")
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        name = _dotted(node.func, aliases)
        head, _, last = name.rpartition(".")
        if head.split(".")[0] == "yaml" and last in UNSAFE_YAML:
            loader = _kw(node, "Loader") or (node.args[1] if len(node.args) > 1 else None)
            if last.startswith(("unsafe", "full")) or loader is None or \
                    _dotted(loader, aliases).rpartition(".")[2] not in SAFE_LOADERS:
                found.append(f"line {node.lineno}: {name}() without a safe Loader")
        if name.split(".")[0] in UNSAFE_MODULES:
            found.append(f"line {node.lineno}: {name}()")
        if last in ("import_module", "__import__") and node.args and isinstance(node.args[0], ast.Constant) \
                and str(node.args[0].value).split(".")[0] in UNSAFE_MODULES:
            found.append(f"line {node.lineno}: {name}({node.args[0].value!r})")
        if name in ("numpy.load", "np.load"):
            allow = _kw(node, "allow_pickle")
            if allow is not None and not (isinstance(allow, ast.Constant) and allow.value is False):
                found.append(f"line {node.lineno}: {name}(allow_pickle=...)")
        if name == "torch.load":
            only = _kw(node, "weights_only")
            if not (isinstance(only, ast.Constant) and only.value is True):
                found.append(f"line {node.lineno}: torch.load() without weights_only=True")
        if last == "read_pickle":
            found.append(f"line {node.lineno}: {name}()")
    return found


@pytest.mark.parametrize("snippet", [
    "import pickle", "import cloudpickle as cp", "from pickle import loads", "import yaml\nyaml.load(s)",
    "import yaml\nyaml.load(s, Loader=yaml.Loader)", "import yaml as y\ny.unsafe_load(s)",
    "from yaml import load\nload(s)", "import yaml\nyaml.full_load(s)",
    "import importlib\nimportlib.import_module('pickle')",
    "__import__('dill')", "import numpy as np\nnp.load(p, allow_pickle=True)", "import torch\ntorch.load(p)",
    "import pandas as pd\npd.read_pickle(p)",
])
def test_the_unpickling_check_catches_each_unsafe_form(snippet):
    assert unsafe_deserialisation(snippet), snippet


@pytest.mark.parametrize("snippet", [
    "import yaml\nyaml.safe_load(s)", "import yaml\nyaml.load(s, Loader=yaml.SafeLoader)",
    "import numpy as np\nnp.load(p)", "import numpy as np\nnp.load(p, allow_pickle=False)",
    "import torch\ntorch.load(p, weights_only=True)", "import json\njson.loads(s)",
])
def test_the_unpickling_check_passes_safe_forms(snippet):
    assert unsafe_deserialisation(snippet) == []


def test_no_pickle_or_unsafe_yaml_anywhere_in_the_package():
    package = Path(__file__).parents[2] / "pytest_hud"
    files = sorted(package.rglob("*.py"))
    assert len(files) > 20
    found = {str(p.relative_to(package)): hits for p in files
             if (hits := unsafe_deserialisation(p.read_text(encoding="utf-8")))}
    assert found == {}
