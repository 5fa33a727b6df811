"""The WebSocket core alone on the per-step path: pytest-hud's hand-written one vs websockets' sans-I/O
protocol objects vs picows, the same exchange on each, side by side in one run.

    python benchmarks/ws_core.py [--rounds 3] [--steps 3000] [--inproc-steps 20000]
                                 [--sizes 200,65536] [--pin none|split|same] [--loop uvloop] [--verbose]
                                 [--before REF] [--impls core,before,...]

``--before REF`` adds the row ``before``: the server and the blocking client of ``git archive REF``
(``benchmarks/git_ref.extract_package``), in the same rounds as this checkout's (``core``), so a
change to the core reads as ``before xN`` (N > 1: REF cost more than this checkout). In process,
REF's modules are imported beside this checkout's (under the same names while they load, then set
aside); over loopback its two processes run with REF's package first on ``PYTHONPATH``. REF has
no row of its own in loop mode (the loop client is this file's). ``--impls`` runs only the named
implementations (``core`` always runs: it is what every ratio is taken to).

Run on the 2-core CPU machine while a CI run shared it (load average 7 to 13), 2 min 5 s:

    $ python benchmarks/ws_core.py --rounds 5
    # observation 200 B / 64 KiB, action 40 B; uvloop; websockets 17.4, picows 2.3.1, Python 3.11.7; 2 CPUs
    # the core's loop client is wsproto's pieces in an asyncio.Protocol (wsconn is blocking only); picows has no blocking client
    # each line: the implementation's figure over core's in the same round (x>1: costs more than core)
    r1 in process  200 B server           websockets CPU x3.63 | picows     CPU x1.00
    r1 in process  200 B blocking client  websockets CPU x3.79
    r1 in process  200 B loop client      websockets CPU x4.30 | picows     CPU x1.07
    r1 in process 64 KiB server           websockets CPU x4.77 | picows     CPU x1.06
    r1 in process 64 KiB blocking client  websockets CPU x2.23
    r1 in process 64 KiB loop client      websockets CPU x2.35 | picows     CPU x0.99
    r1 loopback    200 B blocking pair    websockets client x1.79 server x2.53 both x2.01 wall x3.51
    r1 loopback    200 B loop pair        websockets client x2.54 server x2.50 both x2.52 wall x2.40 | picows     client x0.87 server x0.88 both x0.87 wall x0.64
    r1 loopback   64 KiB blocking pair    websockets client x1.46 server x2.02 both x1.60 wall x2.42
    r1 loopback   64 KiB loop pair        websockets client x2.15 server x2.16 both x2.16 wall x1.96 | picows     client x0.81 server x0.88 both x0.84 wall x0.71
    r2 in process  200 B server           websockets CPU x3.84 | picows     CPU x1.01
    r2 in process  200 B blocking client  websockets CPU x3.93
    r2 in process  200 B loop client      websockets CPU x4.65 | picows     CPU x1.06
    r2 in process 64 KiB server           websockets CPU x5.32 | picows     CPU x1.06
    r2 in process 64 KiB blocking client  websockets CPU x2.50
    r2 in process 64 KiB loop client      websockets CPU x2.46 | picows     CPU x1.03
    r2 loopback    200 B blocking pair    websockets client x1.55 server x1.85 both x1.65 wall x1.02
    r2 loopback    200 B loop pair        websockets client x2.62 server x2.58 both x2.60 wall x2.42 | picows     client x0.89 server x0.89 both x0.89 wall x0.88
    r2 loopback   64 KiB blocking pair    websockets client x1.37 server x1.97 both x1.53 wall x1.81
    r2 loopback   64 KiB loop pair        websockets client x2.14 server x1.99 both x2.07 wall x2.11 | picows     client x0.90 server x0.91 both x0.91 wall x0.85
    r3 in process  200 B server           websockets CPU x3.69 | picows     CPU x1.03
    r3 in process  200 B blocking client  websockets CPU x4.13
    r3 in process  200 B loop client      websockets CPU x4.70 | picows     CPU x1.09
    r3 in process 64 KiB server           websockets CPU x5.24 | picows     CPU x1.08
    r3 in process 64 KiB blocking client  websockets CPU x2.05
    r3 in process 64 KiB loop client      websockets CPU x2.45 | picows     CPU x0.96
    r3 loopback    200 B blocking pair    websockets client x1.75 server x2.25 both x1.91 wall x1.71
    r3 loopback    200 B loop pair        websockets client x2.74 server x2.61 both x2.67 wall x4.23 | picows     client x0.83 server x0.84 both x0.84 wall x1.35
    r3 loopback   64 KiB blocking pair    websockets client x1.17 server x1.55 both x1.27 wall x1.01
    r3 loopback   64 KiB loop pair        websockets client x1.67 server x2.14 both x1.86 wall x1.65 | picows     client x0.59 server x0.80 both x0.68 wall x0.59
    r4 in process  200 B server           websockets CPU x3.95 | picows     CPU x1.05
    r4 in process  200 B blocking client  websockets CPU x3.87
    r4 in process  200 B loop client      websockets CPU x4.68 | picows     CPU x1.11
    r4 in process 64 KiB server           websockets CPU x5.26 | picows     CPU x1.11
    r4 in process 64 KiB blocking client  websockets CPU x2.34
    r4 in process 64 KiB loop client      websockets CPU x2.33 | picows     CPU x1.02
    r4 loopback    200 B blocking pair    websockets client x2.18 server x2.91 both x2.41 wall x2.79
    r4 loopback    200 B loop pair        websockets client x2.04 server x2.02 both x2.03 wall x1.52 | picows     client x0.87 server x0.88 both x0.87 wall x0.73
    r4 loopback   64 KiB blocking pair    websockets client x1.44 server x2.04 both x1.59 wall x1.64
    r4 loopback   64 KiB loop pair        websockets client x1.95 server x2.10 both x2.02 wall x2.02 | picows     client x0.82 server x0.90 both x0.85 wall x0.84
    r5 in process  200 B server           websockets CPU x3.86 | picows     CPU x1.06
    r5 in process  200 B blocking client  websockets CPU x3.97
    r5 in process  200 B loop client      websockets CPU x4.64 | picows     CPU x1.12
    r5 in process 64 KiB server           websockets CPU x5.15 | picows     CPU x1.07
    r5 in process 64 KiB blocking client  websockets CPU x2.29
    r5 in process 64 KiB loop client      websockets CPU x2.37 | picows     CPU x1.02
    r5 loopback    200 B blocking pair    websockets client x1.78 server x2.86 both x2.09 wall x2.08
    r5 loopback    200 B loop pair        websockets client x2.36 server x2.32 both x2.34 wall x2.25 | picows     client x1.01 server x0.99 both x1.00 wall x1.03
    r5 loopback   64 KiB blocking pair    websockets client x1.58 server x2.61 both x1.80 wall x7.01
    r5 loopback   64 KiB loop pair        websockets client x1.98 server x2.10 both x2.04 wall x1.55 | picows     client x0.76 server x0.85 both x0.81 wall x0.24

    median over 5 rounds of the per-round ratio to core (x>1: costs more than core)
    in process, CPU per step of the WebSocket layer alone; and the medians in µs (this run only):
       200 B server           websockets x3.84  picows x1.03     µs (core / websockets / picows): 1.30 / 5.00 / 1.32
       200 B blocking client  websockets x3.93                   µs (core / websockets): 1.57 / 6.42
       200 B loop client      websockets x4.65  picows x1.09     µs (core / websockets / picows): 1.32 / 6.15 / 1.42
      64 KiB server           websockets x5.24  picows x1.07     µs (core / websockets / picows): 1.32 / 6.95 / 1.41
      64 KiB blocking client  websockets x2.29                   µs (core / websockets): 4.98 / 11.30
      64 KiB loop client      websockets x2.37  picows x1.02     µs (core / websockets / picows): 4.55 / 10.59 / 4.64
    loopback (3000 round trips a run, pin none), CPU per round trip of each process, both together, the client's wall:
       200 B blocking pair    websockets client x1.78 server x2.53 both x2.01 wall x2.08
       200 B loop pair        websockets client x2.54 server x2.50 both x2.52 wall x2.40
       200 B loop pair        picows     client x0.87 server x0.88 both x0.87 wall x0.88
      64 KiB blocking pair    websockets client x1.44 server x2.02 both x1.59 wall x1.81
      64 KiB loop pair        websockets client x1.98 server x2.10 both x2.04 wall x1.96
      64 KiB loop pair        picows     client x0.81 server x0.88 both x0.84 wall x0.71
      medians, µs per round trip (this run only); sleeps per round trip; above the floor (no WebSocket), client + server:
       200 B blocking core       client  21.2 (0.02) server   9.7 (0.99) wall  117.3  above floor  22.2
       200 B blocking websockets client  37.0 (0.04) server  22.0 (0.98) wall  244.2  above floor  50.2
       200 B blocking floor      client   4.4 (0.72) server   4.5 (0.37) wall   31.0
       200 B loop     core       client   6.9 (0.52) server   7.0 (0.56) wall   48.6  above floor   4.0
       200 B loop     websockets client  18.3 (0.32) server  18.1 (0.73) wall  113.3  above floor  26.5
       200 B loop     picows     client   6.2 (0.48) server   6.2 (0.61) wall   49.2  above floor   2.6
       200 B loop     floor      client   5.0 (0.47) server   4.9 (0.64) wall   38.9
      64 KiB blocking core       client  51.8 (0.01) server  17.9 (0.99) wall  256.7  above floor  53.2
      64 KiB blocking websockets client  67.6 (0.03) server  32.0 (0.98) wall  380.6  above floor  83.1
      64 KiB blocking floor      client   8.6 (0.12) server   7.9 (0.92) wall   63.2
      64 KiB loop     core       client  13.2 (0.10) server  11.4 (0.93) wall   89.8  above floor   7.9
      64 KiB loop     websockets client  26.9 (0.12) server  24.0 (0.91) wall  181.3  above floor  34.2
      64 KiB loop     picows     client  10.7 (0.09) server  10.0 (0.94) wall   69.9  above floor   4.0
      64 KiB loop     floor      client   8.9 (0.10) server   7.8 (0.94) wall   51.3

The blocking clients again, with ``--top-pad`` (35 s; its per-round lines left out here):

    $ python benchmarks/ws_core.py --rounds 3 --inproc-steps 0 --modes blocking --top-pad
    median over 3 rounds of the per-round ratio to core (x>1: costs more than core)
    loopback (3000 round trips a run, pin none), CPU per round trip of each process, both together, the client's wall:
       200 B blocking pair    websockets client x1.47 server x2.08 both x1.65 wall x1.24
       200 B blocking pair    core+pad   client x0.28 server x0.70 both x0.40 wall x0.37
      64 KiB blocking pair    websockets client x1.34 server x1.87 both x1.47 wall x1.54
      64 KiB blocking pair    core+pad   client x0.24 server x0.70 both x0.36 wall x0.46
      medians, µs per round trip (this run only); sleeps per round trip; above the floor (no WebSocket), client + server:
       200 B blocking core       client  24.0 (0.03) server   9.9 (0.98) wall   96.6  above floor  24.9
       200 B blocking websockets client  35.2 (0.04) server  20.7 (0.98) wall  116.1  above floor  47.0
       200 B blocking floor      client   4.4 (0.74) server   4.5 (0.34) wall   23.0
       200 B blocking core+pad   client   6.8 (0.62) server   6.9 (0.47) wall   40.6  above floor   4.8
      64 KiB blocking core       client  46.4 (0.01) server  14.9 (0.99) wall  150.2  above floor  45.5
      64 KiB blocking websockets client  62.3 (0.03) server  29.7 (0.99) wall  264.2  above floor  76.3
      64 KiB blocking floor      client   8.2 (0.07) server   7.5 (0.95) wall   46.5
      64 KiB blocking core+pad   client  11.1 (0.15) server  10.4 (0.90) wall   66.2  above floor   5.7

Server and client pinned to different CPUs, so that each sleeps and is woken every step (1 min
33 s; per-round lines left out here):

    $ python benchmarks/ws_core.py --rounds 3 --inproc-steps 0 --pin split
    median over 3 rounds of the per-round ratio to core (x>1: costs more than core)
    loopback (3000 round trips a run, pin split), CPU per round trip of each process, both together, the client's wall:
       200 B blocking pair    websockets client x1.18 server x1.27 both x1.22 wall x1.21
       200 B loop pair        websockets client x1.25 server x1.18 both x1.21 wall x1.26
       200 B loop pair        picows     client x0.98 server x0.96 both x0.99 wall x0.84
      64 KiB blocking pair    websockets client x1.30 server x1.35 both x1.32 wall x1.51
      64 KiB loop pair        websockets client x1.36 server x1.23 both x1.27 wall x1.69
      64 KiB loop pair        picows     client x1.00 server x1.00 both x1.00 wall x1.01
      medians, µs per round trip (this run only); sleeps per round trip; above the floor (no WebSocket), client + server:
       200 B blocking core       client  73.6 (0.96) server  55.4 (1.00) wall  699.8  above floor  39.9
       200 B blocking websockets client  86.9 (0.99) server  68.3 (1.00) wall  684.6  above floor  66.2
       200 B blocking floor      client  44.5 (0.99) server  44.6 (1.00) wall  280.3
       200 B loop     core       client  51.5 (1.00) server  52.4 (1.00) wall  374.4  above floor  12.8
       200 B loop     websockets client  64.6 (1.00) server  61.8 (1.00) wall  350.4  above floor  35.1
       200 B loop     picows     client  50.5 (0.99) server  49.4 (1.00) wall  233.9  above floor  10.1
       200 B loop     floor      client  44.5 (1.00) server  46.8 (1.00) wall  301.5
      64 KiB blocking core       client 100.0 (0.99) server  63.4 (1.00) wall  633.8  above floor  56.2
      64 KiB blocking websockets client 130.0 (0.99) server  88.8 (1.00) wall 1079.9  above floor 112.6
      64 KiB blocking floor      client  54.0 (1.00) server  53.1 (1.00) wall  487.9
      64 KiB loop     core       client  63.2 (1.00) server  60.0 (1.00) wall  388.1  above floor  13.1
      64 KiB loop     websockets client  84.0 (1.00) server  73.6 (1.00) wall  503.5  above floor  50.2
      64 KiB loop     picows     client  63.2 (0.99) server  60.0 (1.00) wall  390.3  above floor  13.0
      64 KiB loop     floor      client  56.2 (1.00) server  53.9 (1.00) wall  380.4

Conclusion. Against websockets' sans-I/O objects the hand-written core keeps a clear gain on the
per-step path: alone, websockets' layer costs 3.8-5.2x the core's on the server side and 2.3-4.7x
on the client side (3.7-6.3 µs more per step and side; above 2x in every round); over loopback
that is 2.0-2.5x the CPU of a round trip with a loop client, 1.6-2.0x with the worker's blocking
client, and still 1.2-1.3x when every step also pays a sleep and a wake-up on each side
(``--pin split``). Against picows it keeps no gain that counts: alone the core is at most 0.1 µs
per step cheaper (picows 2-9% more, taking its slower write fallback there), and over loopback
picows' pair costs 0.84-0.87x the core's CPU (level, 0.99-1.00x, when pinned apart): that is its
I/O path (it ``send()``s straight from its buffer, reads into its own buffer through
``BufferedProtocol``, sets TCP_QUICKACK; not told apart here), not its framing. picows has no
blocking client, so the worker's side has no library to move to; the bridge's server side has,
and by the rule its case rests on something other than speed (one core shared with the blocking
client, no compiled dependency). Separately, most of the blocking client's CPU over loopback here
is not the WebSocket layer at all: wsconn's ``recv(262144)`` maps a fresh 256 KiB buffer every read
(``mmap``, a page fault per 4 KiB received, ``munmap``; see ``core+pad`` above), and with
``MALLOC_TOP_PAD_`` at 1 MiB its CPU per round trip drops to 0.24-0.28x (24 to 7 µs at 200 B, 46
to 11 µs at 64 KiB). Whether a real worker's heap does the same depends on its other allocations
(``benchmarks/worker_cpu.py`` would tell); reading into a reused buffer (``recv_into``) avoids it
either way. The client now does that (one buffer for the connection's life, ``recv_into`` and a
copy of what arrived): with ``--rounds 3 --inproc-steps 0 --modes blocking``, its CPU per round trip
at 64 KiB went from 45.6 to 13.6 µs (websockets/core client x1.32 before, x4.88 after), at 200 B
it stayed 6-7 µs.

The exchange is the bridge's, without the bridge: the server sends an "observation" of
``--sizes`` bytes (one binary message, the same bytes every step), the client answers it with a
40-byte "action" (one binary message), and so on. No msgpack, no sim, no policy. Every receiver
ends with the message as a ``bytes`` object it may keep (what the bridge and the worker need) and
checks its length; the first message each way is compared byte for byte.

Implementations, each a server and a client of the same kind (``core`` = (a), ``websockets`` =
(b), ``picows`` = (c)):

- ``core``: the server is ``pytest_hud.bridge.wsserver.WsConnection`` (``serve_ws``) with a
  three-method handler, what the bridge runs; the blocking client is
  ``pytest_hud.wire.wsclient.BlockingWebSocket``, what a worker runs; both run the connection state
  machine ``pytest_hud.wire.wsstate.WsState``. wsclient has no asyncio client, so
  the *loop* client is written here from the core's framing pieces (``websocket.client_request`` /
  ``parse_response``, ``FrameReader.whole`` / ``feed`` / ``next``, ``encode_frame``) in an
  ``asyncio.Protocol`` (not WsState: so that ``--before`` runs it against older cores too).
- ``websockets``: ``websockets.server.ServerProtocol`` in an ``asyncio.Protocol`` (receive_data,
  events_received, send_binary, data_to_send, as its documentation lays out), and
  ``websockets.client.ClientProtocol`` over a blocking socket (blocking mode) or in an
  ``asyncio.Protocol`` (loop mode). Its sans-I/O objects hand out frames, not messages: the glue
  joins fragments (none are sent). The glue is the least a correct user writes; the blocking
  one reads with ``recv(262144)``, as wsconn does.
- ``picows``: ``ws_create_server`` / ``ws_connect`` with ``WSListener`` callbacks; a payload is
  taken with ``get_payload_as_bytes()`` (a copy, as the other two hand out), fragments joined in
  the listener (none are sent). picows has no blocking client: it is in *loop* mode only. It
  sets TCP_QUICKACK, draws mask keys and masks in C, and ``send()``s straight from its own buffer
  when the transport's is empty; all of that is picows and left as it is.
- ``floor`` (loopback only): the same exchange with no WebSocket at all (raw bytes, lengths
  counted), the same process and loop shapes: what every row pays for system calls, sleeps and
  wake-ups and the loop itself. Its blocking client reads into one reused buffer
  (``recv_into``), then copies the message out.
- ``core+pad`` (``--top-pad``, blocking loopback only): core again, its client process started
  with glibc's ``MALLOC_TOP_PAD_`` at 1 MiB. ``recv(262144)`` allocates a 256 KiB buffer per
  read; when the heap's free top is smaller than that, glibc maps it afresh (``mmap``: it is over
  the 128 KiB threshold), the kernel writes the message into new pages (a page fault per 4 KiB)
  and the shrink to the message's size unmaps it (``perf stat``: one ``mmap`` and one ``munmap``
  per read; ``perf record``: four fifths of the client's page faults in recv's copy). The pad
  keeps a free top that holds the buffer, so it comes from the heap, already mapped: what this
  row saves is what that pattern costs.

Client modes: ``blocking``, the worker's shape (one thread: send, then a blocking ``recv``);
``loop``, an asyncio client that answers each observation from its callback, in the same loop
iteration (picows' only shape). Servers always run on an asyncio loop, uvloop when it is
installed (as the bridge does; ``--loop asyncio`` forces the standard one, for both sides).

Two measurements, each a round of every implementation in an order rotated from round to round;
ratios to ``core`` are taken within a round and their median printed at the end:

1. **in process, no I/O** (the WebSocket layer alone): the same server and client objects as
   below, on a fake socket / transport that hands each step's incoming frame over as a fresh
   copy (what a read does) and keeps what is written. CPU per step (``time.process_time``) of
   the server side (take in a masked action frame, hand the handler its bytes, write the
   observation frame) and of the client side (the reverse), one after the other, in one process
   on the same loop. picows' direct ``send()`` is a system call, so here it takes its fallback
   (a ``bytes`` copy handed to the transport); picows is fed through ``get_buffer`` /
   ``buffer_updated``, the other two through ``data_received`` / ``recv``.
2. **loopback** (what it amounts to with the kernel): a server process and a client process
   over TCP on 127.0.0.1 (TCP_NODELAY everywhere), ``--warmup`` steps then ``--steps`` measured
   ones; each process times its own CPU (``time.process_time``, all threads) and voluntary
   context switches (``getrusage``: a sleep and a wake-up each) over the measured steps; the
   client also times the wall clock. ``floor`` rows give what is above them. On a busy 2-core
   machine whether a process sleeps every step or finds its answer waiting changes a round
   trip's CPU several-fold, so single rows swing; only the medians of the per-round ratios mean
   anything. ``--pin split`` puts the server on one CPU and the client on another (each then
   sleeps and is woken every step), ``--pin same`` both on one; the default lets the scheduler
   place them.

Not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import random
import re
import resource
import socket
import subprocess
import sys
import time
from collections import deque
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from git_ref import extract_package  # noqa: E402

BEFORE: dict[str, object] = {}  # --before: "path" (REF's package), "wsserver" and "wsclient" (its modules)
ACTION_BYTES = 40
MAX_SIZE = 1 << 24
HOST = "127.0.0.1"
IMPLS = {"blocking": ("core", "websockets", "floor"), "loop": ("core", "websockets", "picows", "floor")}


def payload(size: int) -> bytes:
    return random.Random(size).randbytes(size)


def _check(data, expected: bytes, first: bool) -> None:
    if len(data) != len(expected) or (first and data != expected):
        raise SystemExit(f"got {len(data)} bytes, expected {len(expected)} (or other bytes)")


def _nodelay(transport) -> None:
    sock = transport.get_extra_info("socket")
    if sock is not None and sock.family != socket.AF_UNIX:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


# ----------------------------------------------------------------------- timing
def _snap() -> tuple[float, float, int]:
    return time.perf_counter(), time.process_time(), resource.getrusage(resource.RUSAGE_SELF).ru_nvcsw


class Meter:
    """``tick()`` once per step; the marks bound steps ``warm + 1`` to ``warm + steps``."""

    __slots__ = ("end", "marks", "n", "warm")

    def __init__(self, warm: int, steps: int) -> None:
        self.n, self.warm, self.end, self.marks = 0, warm, warm + steps, []

    def tick(self) -> None:
        self.n += 1
        if self.n == self.warm or self.n == self.end:
            self.marks.append(_snap())

    def result(self) -> dict[str, float]:
        (w0, c0, v0), (w1, c1, v1) = self.marks
        n = self.end - self.warm
        return {"cpu": (c1 - c0) * 1e6 / n, "sleeps": (v1 - v0) / n, "wall": (w1 - w0) * 1e6 / n}


class Side:
    """What one side of the exchange holds: what it sends, what it expects, its meter."""

    def __init__(self, send: bytes, expect: bytes, meter: Meter, done=None) -> None:
        self.send, self.expect, self.meter, self.done = send, expect, meter, done

    def finish(self) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_result(None)


# ===================================================================== servers
# Each answers the upgrade with one observation, then every action with one, meter.tick() after
# each answer, and side.finish() once the connection is gone.
class CoreHandler:
    """(a) The bridge's server: pytest_hud.bridge.wsserver.WsConnection calls these."""

    def __init__(self, side: Side) -> None:
        self.side = side

    def ws_open(self, conn):
        conn.send(self.side.send)

    def ws_message(self, conn, data):
        side = self.side
        _check(data, side.expect, side.meter.n == 0)
        conn.send(side.send)
        side.meter.tick()

    def ws_closed(self, conn):
        self.side.finish()


@functools.cache
def websockets_server():
    """(b) websockets.server.ServerProtocol in an asyncio.Protocol."""
    from websockets.frames import Frame, Opcode
    from websockets.http11 import Request
    from websockets.server import ServerProtocol

    BINARY, TEXT, CONT = Opcode.BINARY, Opcode.TEXT, Opcode.CONT

    class Conn(asyncio.Protocol):
        def __init__(self, side: Side) -> None:
            self.side, self.parts = side, []
            self.proto = ServerProtocol(max_size=MAX_SIZE)

        def connection_made(self, transport):
            _nodelay(transport)
            self.transport = transport

        def data_received(self, data):
            proto = self.proto
            proto.receive_data(data)
            for event in proto.events_received():
                if type(event) is Frame:
                    opcode = event.opcode
                    if (opcode is BINARY or opcode is TEXT) and event.fin:
                        self.message(event.data)
                    elif opcode is BINARY or opcode is TEXT or opcode is CONT:
                        self.parts.append(event.data)
                        if event.fin:
                            self.message(b"".join(self.parts))
                            self.parts = []
                elif type(event) is Request:
                    proto.send_response(proto.accept(event))
                    if proto.handshake_exc is None:
                        proto.send_binary(self.side.send)
            self.flush()

        def message(self, data):
            side = self.side
            _check(data, side.expect, side.meter.n == 0)
            self.proto.send_binary(side.send)
            side.meter.tick()

        def flush(self):
            for data in self.proto.data_to_send():
                if data:
                    self.transport.write(data)
                else:  # SEND_EOF: the server closes TCP after the closing handshake
                    self.transport.close()

        def connection_lost(self, exc):
            self.side.finish()

    return Conn


@functools.cache
def picows_listeners():
    """(c) picows listeners: (server listener, client listener)."""
    from picows import WSCloseCode, WSListener, WSMsgType

    BINARY, TEXT, CONT, CLOSE = WSMsgType.BINARY, WSMsgType.TEXT, WSMsgType.CONTINUATION, WSMsgType.CLOSE

    class Joiner(WSListener):
        def __init__(self):
            self.parts, self.transport = [], None

        def on_ws_frame(self, transport, frame):
            kind = frame.msg_type
            if (kind is BINARY or kind is TEXT) and frame.fin:
                self.message(frame.get_payload_as_bytes())
            elif kind is BINARY or kind is TEXT or kind is CONT:
                self.parts.append(frame.get_payload_as_bytes())
                if frame.fin:
                    self.message(b"".join(self.parts))
                    self.parts = []
            elif kind is CLOSE and not transport.is_client_side:
                transport.send_close(frame.get_close_code(), frame.get_close_message())
                transport.disconnect()

    class Server(Joiner):
        def __init__(self, side: Side):
            super().__init__()
            self.side = side

        def on_ws_connected(self, transport):
            self.transport = transport
            transport.send(BINARY, self.side.send)

        def message(self, data):
            side = self.side
            _check(data, side.expect, side.meter.n == 0)
            self.transport.send(BINARY, side.send)
            side.meter.tick()

        def on_ws_disconnected(self, transport):
            self.side.finish()

    class Client(Joiner):
        def __init__(self, client: LoopClient):
            super().__init__()
            self.client = client

        def on_ws_connected(self, transport):
            self.client.conn, self.transport = self, transport

        def message(self, data):
            self.client.on_message(data)

        def on_ws_disconnected(self, transport):
            self.client.gone.set_result(None)

        def send(self, data):
            self.transport.send(BINARY, data)

        def close(self):
            self.transport.send_close(WSCloseCode.OK)

    return Server, Client


class FloorServer(asyncio.Protocol):
    """No WebSocket: raw bytes, an action counted by its length."""

    def __init__(self, side: Side) -> None:
        self.side, self.got = side, 0

    def connection_made(self, transport):
        _nodelay(transport)
        self.transport = transport
        transport.write(self.side.send)

    def data_received(self, data):
        self.got += len(data)
        if self.got >= ACTION_BYTES:
            self.got -= ACTION_BYTES
            self.transport.write(self.side.send)
            self.side.meter.tick()

    def connection_lost(self, exc):
        self.side.finish()


async def start_server(impl: str, side: Side) -> int:
    """Listen on 127.0.0.1 for ``impl``; returns the port."""
    loop = asyncio.get_running_loop()
    if impl == "core":  # also REF's under --before: its process has REF's package on PYTHONPATH
        from pytest_hud.bridge.wsserver import serve_ws

        return (await serve_ws(CoreHandler(side), HOST, 0, MAX_SIZE)).port
    if impl == "picows":
        from picows import ws_create_server

        server_listener = picows_listeners()[0]
        server = await ws_create_server(lambda request: server_listener(side), HOST, 0, max_frame_size=MAX_SIZE)
    else:
        factory = websockets_server() if impl == "websockets" else FloorServer
        server = await loop.create_server(lambda: factory(side), HOST, 0)
    return server.sockets[0].getsockname()[1]


# ============================================================= blocking clients
# Each: ``recv() -> bytes`` (the next observation), ``send(bytes)``, ``close()``.
def core_blocking(port: int, sock=None, wsclient=None):
    """(a) What a worker runs: pytest_hud.wire.wsclient.BlockingWebSocket (``wsclient``: --before's)."""
    if wsclient is None:
        from pytest_hud.wire import wsclient

    ws = wsclient.BlockingWebSocket(f"ws://{HOST}:{port}/", MAX_SIZE, sock=sock)
    return lambda: ws.recv(30.0), ws.send, ws.close


def websockets_blocking(port: int, sock=None):
    """(b) websockets.client.ClientProtocol over a blocking socket."""
    from websockets.client import ClientProtocol
    from websockets.frames import Frame, Opcode
    from websockets.protocol import State
    from websockets.uri import parse_uri

    BINARY, TEXT, CONT = Opcode.BINARY, Opcode.TEXT, Opcode.CONT
    if sock is None:
        sock = socket.create_connection((HOST, port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    proto = ClientProtocol(parse_uri(f"ws://{HOST}:{port}/"), max_size=MAX_SIZE)
    messages: deque[bytes] = deque()
    parts: list[bytes] = []

    def flush():
        for data in proto.data_to_send():
            if data:
                sock.sendall(data)
            else:
                sock.shutdown(socket.SHUT_WR)

    def read():
        data = sock.recv(262144)
        if data:
            proto.receive_data(data)
        else:
            proto.receive_eof()
        for event in proto.events_received():
            if type(event) is Frame:
                opcode = event.opcode
                if (opcode is BINARY or opcode is TEXT) and event.fin:
                    messages.append(event.data)
                elif opcode is BINARY or opcode is TEXT or opcode is CONT:
                    parts.append(event.data)
                    if event.fin:
                        messages.append(b"".join(parts))
                        parts.clear()
        flush()

    def recv():
        while not messages:
            if proto.state is State.CLOSED:
                raise proto.close_exc
            read()
        return messages.popleft()

    def send(data):
        proto.send_binary(data)
        flush()

    def close():
        proto.send_close()
        flush()
        while proto.state is not State.CLOSED:
            read()
        sock.close()

    proto.send_request(proto.connect())
    flush()
    while proto.state is State.CONNECTING:
        read()
    if proto.handshake_exc is not None:
        raise proto.handshake_exc
    return recv, send, close


def floor_blocking(port: int, size: int):
    """No WebSocket: reads into one reused buffer (no heap growth per read), one copy out."""
    sock = socket.create_connection((HOST, port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = bytearray(262144)
    view = memoryview(buf)

    def recv():
        got = sock.recv_into(buf)
        while got < size:
            got += sock.recv_into(view[got:])
        return bytes(view[:got])

    return recv, sock.sendall, sock.close


BLOCKING = {"core": core_blocking, "websockets": websockets_blocking,
            "before": lambda port, sock=None: core_blocking(port, sock, BEFORE["wsclient"])}


def load_before(ref: str, into: Path) -> None:
    """Unpack REF's package into ``into`` and import its server and client beside this checkout's:
    with this checkout's ``pytest_hud`` modules set aside, REF's are imported from ``into``, kept
    (their functions hold their own module globals), then taken out of ``sys.modules`` again."""
    import importlib

    extract_package(ref, into)

    def ours(name: str) -> bool:
        return name == "pytest_hud" or name.startswith("pytest_hud.")

    saved = {name: sys.modules.pop(name) for name in [n for n in sys.modules if ours(n)]}
    sys.path.insert(0, str(into))
    try:
        importlib.invalidate_caches()
        BEFORE["wsserver"] = importlib.import_module("pytest_hud.bridge.wsserver")
        BEFORE["wsclient"] = importlib.import_module("pytest_hud.wire.wsclient")
        BEFORE["path"] = into
        where = Path(BEFORE["wsclient"].__file__).resolve()
        if not where.is_relative_to(into.resolve()):
            raise SystemExit(f"--before: imported {where}, not REF's package under {into}")
    finally:
        sys.path.remove(str(into))
        for name in [n for n in sys.modules if ours(n)]:
            del sys.modules[name]
        sys.modules.update(saved)
        importlib.invalidate_caches()


def blocking_steps(recv, send, side: Side, n: int) -> None:
    """The worker's loop: an observation in, an action out."""
    meter, action, obs = side.meter, side.send, side.expect
    for _ in range(n):
        data = recv()
        _check(data, obs, meter.n == 0)
        send(action)
        meter.tick()


# ================================================================= loop clients
class LoopClient:
    """An asyncio client's side: ``on_message`` answers each observation from the loop's callback.
    ``conn`` (``send(bytes)``, ``close()``) is set by the connection itself once connected, as an
    observation may arrive before the connect call returns."""

    def __init__(self, side: Side, total: int, finished=None, gone=None) -> None:
        self.side, self.total, self.finished, self.gone = side, total, finished, gone
        self.conn = None

    def on_message(self, data) -> None:
        side = self.side
        meter = side.meter
        _check(data, side.expect, meter.n == 0)
        if meter.n == self.total:  # the answer to the last action
            self.finished.set_result(None)
            return
        self.conn.send(side.send)
        meter.tick()


class CoreLoopClient(asyncio.Protocol):
    """(a) The core's framing pieces in an asyncio.Protocol (wsclient is blocking only)."""

    def __init__(self, client: LoopClient, port: int) -> None:
        from pytest_hud.wire import websocket as wsproto

        self.ws, self.client, self.port = wsproto, client, port
        self.reader = wsproto.FrameReader(MAX_SIZE, masked=False)
        self.head, self.open = b"", False

    def connection_made(self, transport):
        self.client.conn, self.transport = self, transport
        request, self.accept = self.ws.client_request(HOST, self.port, "/")
        transport.write(request)

    def data_received(self, data):
        ws = self.ws
        if not self.open:
            head = self.head + data
            end = head.find(b"\r\n\r\n")
            if end < 0:
                self.head = head
                return
            status, _, _ = ws.parse_response(head[:end], self.accept)
            if status != 101:
                raise SystemExit(f"handshake refused: {status}")
            self.open, data = True, head[end + 4:]
            if not data:
                return
        reader = self.reader
        message = reader.whole(data)  # one whole frame: as WsState.receive
        if message is not None:
            self.client.on_message(message)
            return
        reader.feed(data)
        while (frame := reader.next()) is not None:
            opcode, message = frame
            if opcode == ws.OP_BINARY or opcode == ws.OP_TEXT:
                self.client.on_message(message)
            elif opcode == ws.OP_PING:
                self.transport.write(ws.encode_frame(ws.OP_PONG, message, mask=True))
            elif opcode == ws.OP_CLOSE:
                self.transport.close()
                return

    def send(self, data):
        self.transport.write(self.ws.encode_frame(self.ws.OP_BINARY, data, mask=True))

    def close(self):
        self.transport.write(self.ws.encode_frame(self.ws.OP_CLOSE, self.ws.close_payload(1000), mask=True))

    def connection_lost(self, exc):
        self.client.gone.set_result(None)


@functools.cache
def websockets_loop_client():
    """(b) websockets.client.ClientProtocol in an asyncio.Protocol."""
    from websockets.client import ClientProtocol
    from websockets.frames import Frame, Opcode
    from websockets.uri import parse_uri

    BINARY, TEXT, CONT = Opcode.BINARY, Opcode.TEXT, Opcode.CONT

    class Conn(asyncio.Protocol):
        def __init__(self, client: LoopClient, port: int) -> None:
            self.client, self.parts = client, []
            self.proto = ClientProtocol(parse_uri(f"ws://{HOST}:{port}/"), max_size=MAX_SIZE)

        def connection_made(self, transport):
            _nodelay(transport)
            self.client.conn, self.transport = self, transport
            self.proto.send_request(self.proto.connect())
            self.flush()

        def data_received(self, data):
            proto = self.proto
            proto.receive_data(data)
            for event in proto.events_received():
                if type(event) is Frame:
                    opcode = event.opcode
                    if (opcode is BINARY or opcode is TEXT) and event.fin:
                        self.client.on_message(event.data)
                    elif opcode is BINARY or opcode is TEXT or opcode is CONT:
                        self.parts.append(event.data)
                        if event.fin:
                            self.client.on_message(b"".join(self.parts))
                            self.parts = []
                elif proto.handshake_exc is not None:  # the Response
                    raise proto.handshake_exc
            self.flush()

        def flush(self):
            for data in self.proto.data_to_send():
                if data:
                    self.transport.write(data)
                elif self.transport.can_write_eof():
                    self.transport.write_eof()

        def send(self, data):
            self.proto.send_binary(data)
            self.flush()

        def close(self):
            self.proto.send_close()
            self.flush()

        def eof_received(self):
            self.proto.receive_eof()
            self.flush()

        def connection_lost(self, exc):
            self.client.gone.set_result(None)

    return Conn


class FloorLoopClient(asyncio.Protocol):
    def __init__(self, client: LoopClient, port: int) -> None:
        self.client, self.size, self.chunks, self.got = client, len(client.side.expect), [], 0

    def connection_made(self, transport):
        _nodelay(transport)
        self.client.conn, self.transport = self, transport

    def data_received(self, data):
        self.got += len(data)
        if self.got < self.size:
            self.chunks.append(data)
            return
        if self.chunks:
            self.chunks.append(data)
            data, self.chunks = b"".join(self.chunks), []
        self.got = 0
        self.client.on_message(data)

    def send(self, data):
        self.transport.write(data)

    def close(self):
        self.transport.close()

    def connection_lost(self, exc):
        self.client.gone.set_result(None)


async def connect_loop_client(impl: str, client: LoopClient, port: int) -> None:
    if impl == "picows":
        from picows import ws_connect

        client_listener = picows_listeners()[1]
        await ws_connect(lambda: client_listener(client), f"ws://{HOST}:{port}/", max_frame_size=MAX_SIZE)
        return
    factory = {"core": CoreLoopClient, "floor": FloorLoopClient}.get(impl) or websockets_loop_client()
    await asyncio.get_running_loop().create_connection(lambda: factory(client, port), HOST, port)


# ======================================================= loopback: the processes
async def run_server(spec) -> None:
    done = asyncio.get_running_loop().create_future()
    side = Side(payload(spec["size"]), payload(ACTION_BYTES), Meter(spec["warmup"], spec["steps"]), done)
    port = await start_server(spec["impl"], side)
    print(json.dumps({"port": port}), flush=True)
    await asyncio.wait_for(done, 300)
    print(json.dumps(side.meter.result()), flush=True)


def run_blocking_client(spec) -> dict:
    size, total = spec["size"], spec["warmup"] + spec["steps"]
    side = Side(payload(ACTION_BYTES), payload(size), Meter(spec["warmup"], spec["steps"]))
    if spec["impl"] == "floor":
        recv, send, close = floor_blocking(spec["port"], size)
    else:
        recv, send, close = BLOCKING[spec["impl"]](spec["port"])
    blocking_steps(recv, send, side, total)
    _check(recv(), side.expect, False)  # the answer to the last action
    close()
    return side.meter.result()


async def run_loop_client(spec) -> dict:
    loop = asyncio.get_running_loop()
    side = Side(payload(ACTION_BYTES), payload(spec["size"]), Meter(spec["warmup"], spec["steps"]))
    client = LoopClient(side, spec["warmup"] + spec["steps"], loop.create_future(), loop.create_future())
    await connect_loop_client(spec["impl"], client, spec["port"])
    await asyncio.wait_for(client.finished, 300)
    client.conn.close()
    await asyncio.wait_for(client.gone, 10)
    return side.meter.result()


def _loop_factory(name: str):
    if name == "uvloop":
        import uvloop

        return uvloop.new_event_loop
    return asyncio.new_event_loop


def role(spec) -> None:
    cpus = sorted(os.sched_getaffinity(0))
    if spec["pin"] == "split" and len(cpus) > 1:  # the server on one CPU, the client on another
        os.sched_setaffinity(0, {cpus[0] if spec["role"] == "server" else cpus[1]})
    elif spec["pin"] == "same":
        os.sched_setaffinity(0, {cpus[0]})
    factory = _loop_factory(spec["loop"])
    if spec["role"] == "server":
        with asyncio.Runner(loop_factory=factory) as runner:
            runner.run(run_server(spec))
    elif spec["mode"] == "blocking":
        print(json.dumps(run_blocking_client(spec)), flush=True)
    else:
        with asyncio.Runner(loop_factory=factory) as runner:
            print(json.dumps(runner.run(run_loop_client(spec))), flush=True)


TOP_PAD = "core+pad"  # --top-pad: core again, its client process with glibc's MALLOC_TOP_PAD_ at 1 MiB


def loopback(impl: str, mode: str, size: int, args) -> dict:
    """One server process and one client process of ``impl``; their figures per round trip."""
    client_env = server_env = None
    if impl == TOP_PAD:
        impl, client_env = "core", dict(os.environ, MALLOC_TOP_PAD_=str(1 << 20))
    elif impl == "before":  # core, from REF's package
        path = os.pathsep.join(p for p in (str(BEFORE["path"]), os.environ.get("PYTHONPATH")) if p)
        impl, client_env = "core", dict(os.environ, PYTHONPATH=path)
        server_env = client_env
    spec = {"impl": impl, "mode": mode, "size": size, "steps": args.steps, "warmup": args.warmup,
            "loop": args.loop, "pin": args.pin}
    cmd = [sys.executable, __file__, "--role"]
    server = subprocess.Popen([*cmd, json.dumps(dict(spec, role="server"))], stdout=subprocess.PIPE,
                              text=True, env=server_env)
    try:
        assert server.stdout is not None
        line = server.stdout.readline()
        if not line:
            raise SystemExit(f"{impl} server failed to start")
        port = json.loads(line)["port"]
        out = subprocess.run([*cmd, json.dumps(dict(spec, role="client", port=port))], env=client_env,
                             check=False, stdout=subprocess.PIPE, text=True, timeout=600)
        if out.returncode != 0:
            raise SystemExit(f"{impl} {mode} client failed (exit {out.returncode})")
        client = json.loads(out.stdout.strip().splitlines()[-1])
        line = server.stdout.readline()
        if not line:
            raise SystemExit(f"{impl} server gave no figures")
        served = json.loads(line)
        server.wait(10)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    return {"client": client["cpu"], "server": served["cpu"], "both": client["cpu"] + served["cpu"],
            "wall": client["wall"], "client sleeps": client["sleeps"], "server sleeps": served["sleeps"]}


# ================================================== in process: the layer alone
_KEY = re.compile(rb"sec-websocket-key:\s*(\S+)", re.IGNORECASE)


def _answer(data) -> bytes | None:
    """The server's 101 to a client's upgrade request (None for anything else)."""
    from pytest_hud.wire.websocket import accept_key, switching_protocols

    data = bytes(data)
    if not data.startswith(b"GET "):
        return None
    return switching_protocols(accept_key(_KEY.search(data).group(1).decode()))


class _FakeSockInfo:
    family = socket.AF_INET

    def fileno(self):
        return -1

    def setsockopt(self, *a):
        pass

    def getsockopt(self, *a):
        return 0


class FakeTransport:
    """An asyncio transport that keeps what is written; a client's upgrade request gets its 101
    queued in ``pending``. It reports a non-empty write buffer, so picows writes through it."""

    def __init__(self) -> None:
        self.pending: list[bytes] = []
        self.out = None

    def write(self, data):
        reply = _answer(data) if not self.pending and self.out is None else None
        if reply is not None:
            self.pending.append(reply)
        self.out = data

    def writelines(self, parts):
        self.out = parts

    def get_extra_info(self, name, default=None):
        return {"socket": _FakeSockInfo(), "peername": (HOST, 1), "sockname": (HOST, 2)}.get(name, default)

    def get_write_buffer_size(self):
        return 1

    def is_closing(self):
        return False

    def can_write_eof(self):
        return False

    def close(self):
        pass

    abort = pause_reading = resume_reading = close


class FakeSocket:
    """A blocking socket whose ``recv`` hands over a fresh copy of ``wire`` (after the 101), and
    whose ``recv_into`` copies it into the caller's buffer."""

    family = socket.AF_INET

    def __init__(self, wire: bytearray) -> None:
        self.wire, self.pending, self.out = wire, [], None

    def sendall(self, data):
        reply = _answer(data) if self.out is None else None
        if reply is not None:
            self.pending.append(reply)
        self.out = data

    def recv(self, n):
        if self.pending:
            return self.pending.pop()
        return bytes(self.wire)

    def recv_into(self, buf, n=0):
        """What the kernel does for core's client (one reused buffer): the frame copied into it."""
        data = self.pending.pop() if self.pending else self.wire
        buf[:len(data)] = data
        return len(data)

    def fileno(self):
        return 99

    def settimeout(self, *a):
        pass

    setsockopt = shutdown = close = settimeout


def _feed_buffered(proto, wire: bytearray) -> None:
    """What uvloop does for a BufferedProtocol: recv_into its buffer, then buffer_updated."""
    view, pos, n = memoryview(wire), 0, len(wire)
    while pos < n:
        buf = proto.get_buffer(-1)
        k = min(len(buf), n - pos)
        buf[:k] = view[pos:pos + k]
        proto.buffer_updated(k)
        pos += k


def _picows_protocol(client_side: bool, factory):
    import logging

    from picows import WSAutoPingStrategy
    from picows.picows import WSProtocol

    logger = logging.getLogger("picows.client" if client_side else "picows.server")
    return WSProtocol(f"{HOST}:1" if client_side else None, "/" if client_side else None, client_side,
                      factory, logger, True, None, False, 10, 10, WSAutoPingStrategy.PING_WHEN_IDLE, True,
                      MAX_SIZE, None, 16 * 1024)


def inproc_server(impl: str, size: int, n: int, warm: int) -> float:
    """CPU µs per step of a server taking in a masked action frame and writing an observation."""
    from pytest_hud.wire.websocket import OP_BINARY, client_request, encode_frame

    side = Side(payload(size), payload(ACTION_BYTES), Meter(1 << 60, 1))
    wire = bytearray(encode_frame(OP_BINARY, side.expect, mask=True))
    transport = FakeTransport()
    request = bytearray(client_request(HOST, 1, "/")[0])
    if impl == "picows":
        proto = _picows_protocol(False, lambda request: picows_listeners()[0](side))
        proto.connection_made(transport)
        _feed_buffered(proto, request)

        def steps(k):
            for _ in range(k):
                _feed_buffered(proto, wire)
    else:
        if impl == "core" or impl == "before":
            if impl == "before":
                wsserver = BEFORE["wsserver"]
            else:
                from pytest_hud.bridge import wsserver

            conn = wsserver.WsConnection(CoreHandler(side), MAX_SIZE)
        else:
            conn = websockets_server()(side)
        conn.connection_made(transport)
        conn.data_received(bytes(request))
        feed = conn.data_received

        def steps(k):
            for _ in range(k):
                feed(bytes(wire))
    return _time(steps, n, warm, side.meter)


def inproc_client(impl: str, mode: str, size: int, n: int, warm: int) -> float:
    """CPU µs per step of a client taking in an observation frame and writing a masked action."""
    from pytest_hud.wire.websocket import OP_BINARY, frame_header

    side = Side(payload(ACTION_BYTES), payload(size), Meter(1 << 60, 1))
    wire = bytearray(frame_header(OP_BINARY, size) + side.expect)
    if mode == "blocking":
        recv, send, _ = BLOCKING[impl](1, sock=FakeSocket(wire))
        return _time(lambda k: blocking_steps(recv, send, side, k), n, warm, side.meter)
    client = LoopClient(side, 1 << 60)
    transport = FakeTransport()
    if impl == "picows":
        proto = _picows_protocol(True, lambda: picows_listeners()[1](client))
        proto.connection_made(transport)
        _feed_buffered(proto, bytearray(transport.pending.pop()))

        def steps(k):
            for _ in range(k):
                _feed_buffered(proto, wire)
    else:
        conn = (CoreLoopClient if impl == "core" else websockets_loop_client())(client, 1)
        conn.connection_made(transport)
        conn.data_received(transport.pending.pop())
        feed = conn.data_received

        def steps(k):
            for _ in range(k):
                feed(bytes(wire))
    return _time(steps, n, warm, side.meter)


def _time(steps, n: int, warm: int, meter: Meter) -> float:
    """CPU µs per step of ``steps(n)``, after ``steps(warm)``; every step must have been answered."""
    steps(warm)
    t0 = time.process_time()
    steps(n)
    cpu = (time.process_time() - t0) * 1e6 / n
    if meter.n != warm + n:
        raise SystemExit(f"{meter.n} of {warm + n} steps answered")
    return cpu


# ===================================================================== reports
def _med(values: list[float]) -> float:
    v = sorted(values)
    k = len(v)
    return v[k // 2] if k % 2 else (v[k // 2 - 1] + v[k // 2]) / 2


def _size(n: int) -> str:
    return f"{n // 1024} KiB" if n >= 1024 and n % 1024 == 0 else f"{n} B"


def _rotated(items: tuple, rnd: int) -> tuple:
    k = rnd % len(items)
    return items[k:] + items[:k]


def _ratios(got: dict[str, dict], keys, store: dict, label) -> str:
    """Each implementation's figures over core's, kept in ``store``; one line of them."""
    parts = []
    for impl, r in got.items():
        if impl == "core":
            continue
        for k in keys:
            store.setdefault((*label, impl, k), []).append(r[k] / got["core"][k])
        parts.append(f"{impl:<10} " + " ".join(f"{k} x{r[k] / got['core'][k]:.2f}" for k in keys))
    return " | ".join(parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--role", help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3000, help="Measured round trips per loopback run")
    parser.add_argument("--warmup", type=int, default=300, help="Round trips before the measured ones")
    parser.add_argument("--inproc-steps", type=int, default=20000,
                        help="Steps per in-process run, a quarter of that for frames over 4 KiB "
                             "(0: skip the in-process part)")
    parser.add_argument("--no-loopback", action="store_true", help="Only the in-process part")
    parser.add_argument("--sizes", default="200,65536", help="Observation sizes in bytes, comma-separated")
    parser.add_argument("--modes", default="blocking,loop", help="Client modes: blocking, loop")
    parser.add_argument("--pin", default="none", choices=("none", "split", "same"),
                        help="Loopback processes' CPUs: as the scheduler likes (none), the server on one "
                             "and the client on another (split), both on one (same)")
    parser.add_argument("--top-pad", action="store_true",
                        help=f"Also run core's blocking client with MALLOC_TOP_PAD_=1 MiB (row {TOP_PAD}): "
                             "how much of its loopback cost is the heap growing and shrinking under recv()")
    parser.add_argument("--verbose", action="store_true", help="Also print every run's own figures")
    parser.add_argument("--before", metavar="REF",
                        help="Also run the server and blocking client of this git ref (row 'before')")
    parser.add_argument("--impls", help="Only these implementations, comma-separated (core always runs): "
                                        "before, websockets, picows, floor, " + TOP_PAD)
    default_loop = "asyncio"
    try:
        import uvloop  # noqa: F401

        default_loop = "uvloop"
    except ImportError:
        pass
    parser.add_argument("--loop", default=default_loop, choices=("uvloop", "asyncio"),
                        help="Event loop of the servers and the loop clients (default: uvloop when installed)")
    args = parser.parse_args()
    if args.role:
        role(json.loads(args.role))
        return
    sizes = [int(s) for s in args.sizes.split(",")]
    modes = [m for m in args.modes.split(",") if m in IMPLS]
    if args.top_pad:
        IMPLS["blocking"] = (*IMPLS["blocking"], TOP_PAD)
    impls3 = ("core", "websockets", "picows")
    if args.before:
        import atexit
        import shutil
        import tempfile

        into = Path(tempfile.mkdtemp(prefix="ws_core_before_"))
        atexit.register(shutil.rmtree, into, True)
        load_before(args.before, into)
        impls3 = ("core", "before", *impls3[1:])
        IMPLS["blocking"] = ("core", "before", *IMPLS["blocking"][1:])
    if args.impls:
        keep = {"core", *args.impls.split(",")}
        impls3 = tuple(i for i in impls3 if i in keep)
        for mode in IMPLS:
            IMPLS[mode] = tuple(i for i in IMPLS[mode] if i in keep)
    import websockets

    try:
        import picows

        with_picows = f"picows {picows.__version__}"
    except ImportError:  # not a dependency of pytest-hud: its rows are left out
        with_picows = "picows not installed (pip install picows): its rows left out"
        impls3 = tuple(i for i in impls3 if i != "picows")
        IMPLS["loop"] = tuple(i for i in IMPLS["loop"] if i != "picows")
    print(f"# observation {' / '.join(_size(s) for s in sizes)}, action {ACTION_BYTES} B; {args.loop}; "
          f"websockets {websockets.__version__}, {with_picows}, Python {sys.version.split()[0]}; "
          f"{os.cpu_count()} CPUs")
    print("# the core's loop client is its framing pieces in an asyncio.Protocol (wsclient is blocking "
          "only); picows has no blocking client")
    if args.before:
        import pytest_hud

        print(f"# core: {Path(pytest_hud.__file__).parent}; before: {args.before}, unpacked at {BEFORE['path']}")
    print("# each line: the implementation's figure over core's in the same round (x>1: costs more than core)")
    inproc: dict[tuple, list[float]] = {}
    rows: dict[tuple, list[dict]] = {}
    ratios: dict[tuple, list[float]] = {}
    keys_in = ["server"] + [f"{m} client" for m in modes]
    runner = asyncio.Runner(loop_factory=_loop_factory(args.loop))
    for rnd in range(args.rounds):
        if args.inproc_steps:
            for size in sizes:
                n = args.inproc_steps if size <= 4096 else max(args.inproc_steps // 4, 1)
                warm = max(n // 10, 1)
                got: dict[str, dict] = {impl: {} for impl in impls3}
                for impl in _rotated(impls3, rnd):
                    got[impl]["server"] = runner.run(_in_loop(inproc_server, impl, size, n, warm))
                    for mode in modes:
                        if impl in IMPLS[mode]:
                            got[impl][f"{mode} client"] = runner.run(
                                _in_loop(inproc_client, impl, mode, size, n, warm))
                for impl, r in got.items():
                    for k, v in r.items():
                        inproc.setdefault((size, k, impl), []).append(v)
                    if args.verbose:
                        print(f"r{rnd + 1} in process {_size(size):>6} {impl:<10} "
                              + "  ".join(f"{k} {v:5.2f} µs" for k, v in r.items()), flush=True)
                for key in keys_in:
                    sub = {impl: {"CPU": r[key]} for impl, r in got.items() if key in r}
                    if len(sub) < 2:  # core alone (--impls): no ratio to print
                        continue
                    print(f"r{rnd + 1} in process {_size(size):>6} {key:<16} "
                          + _ratios(sub, ("CPU",), ratios, ("in process", size, key)), flush=True)
        if args.no_loopback:
            continue
        for size in sizes:
            for mode in modes:
                got = {}
                for impl in _rotated(IMPLS[mode], rnd):
                    r = got[impl] = loopback(impl, mode, size, args)
                    rows.setdefault((size, mode, impl), []).append(r)
                    if args.verbose:
                        print(f"r{rnd + 1} loopback   {_size(size):>6} {mode:<8} {impl:<10} "
                              f"client {r['client']:6.1f} µs ({r['client sleeps']:.2f} sleeps)  "
                              f"server {r['server']:6.1f} µs ({r['server sleeps']:.2f} sleeps)  "
                              f"wall {r['wall']:6.1f} µs", flush=True)
                got = {impl: got[impl] for impl in IMPLS[mode] if impl != "floor"}
                print(f"r{rnd + 1} loopback   {_size(size):>6} {mode + ' pair':<16} "
                      + _ratios(got, ("client", "server", "both", "wall"), ratios, ("loopback", size, mode)),
                      flush=True)
    runner.close()

    print(f"\nmedian over {args.rounds} rounds of the per-round ratio to core (x>1: costs more than core)")
    if inproc:
        print("in process, CPU per step of the WebSocket layer alone; and the medians in µs (this run only):")
        for size in sizes:
            for key in keys_in:
                here = [i for i in impls3 if (size, key, i) in inproc]
                q = "  ".join(f"{i} x{_med(ratios[('in process', size, key, i, 'CPU')]):.2f}" for i in here[1:])
                us = " / ".join(f"{_med(inproc[(size, key, i)]):.2f}" for i in here)
                print(f"  {_size(size):>6} {key:<16} {q:<34} µs ({' / '.join(here)}): {us}")
    if rows:
        print(f"loopback ({args.steps} round trips a run, pin {args.pin}), CPU per round trip of each process, "
              "both together, the client's wall:")
        for size in sizes:
            for mode in modes:
                for impl in IMPLS[mode][1:]:
                    if impl == "floor":
                        continue
                    q = " ".join(f"{k} x{_med(ratios[('loopback', size, mode, impl, k)]):.2f}"
                                 for k in ("client", "server", "both", "wall"))
                    print(f"  {_size(size):>6} {mode + ' pair':<16} {impl:<10} {q}")
        print("  medians, µs per round trip (this run only); sleeps per round trip; above the floor "
              "(no WebSocket), client + server:")
        for size in sizes:
            for mode in modes:
                fl = rows.get((size, mode, "floor"))
                f_b = _med([r["both"] for r in fl]) if fl else 0.0
                for impl in IMPLS[mode]:
                    rs = rows[(size, mode, impl)]
                    c, s, b, w, cs, ss = (_med([r[k] for r in rs]) for k in
                                          ("client", "server", "both", "wall", "client sleeps", "server sleeps"))
                    extra = "" if impl == "floor" or not fl else f"  above floor {b - f_b:5.1f}"
                    print(f"  {_size(size):>6} {mode:<8} {impl:<10} client {c:5.1f} ({cs:.2f}) server {s:5.1f} "
                          f"({ss:.2f}) wall {w:6.1f}{extra}")


async def _in_loop(fn, *a):
    """In-process runs need a running loop (timers, futures), though nothing waits on it."""
    return fn(*a)


if __name__ == "__main__":
    main()
