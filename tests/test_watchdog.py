"""The peer watchdog's own thread (trainer/run/watchdog.py): it has ended when ``stop()`` returns.

A daemon thread still inside a TCPStore call when Python exits is torn down in C++ and the process ends by
SIGABRT: a rank refusing a checkpoint (exit 2, permanent) was seen ending -6 in a test run, which a launcher
reads as a crash. And a call to a store whose host is frozen never returns, whatever the store's timeout: the
subprocess test drives a real TCPStore whose host is stopped (SIGSTOP), as a frozen rank 0 or a node gone
without a TCP reset; the unit tests use a stand-in store whose calls block as such a host's do.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from tests.helpers import ROOT

pytest.importorskip("torch")

from trainer.run.watchdog import _DONE, _PREFIX, EXIT_PEER_LOST, PeerWatchdog  # noqa: E402


class SlowStore:
    """A store whose check() blocks ``delay`` seconds (a store host busy, or stopped, but not gone)."""

    def __init__(self, delay: float):
        self.delay, self.keys = delay, {}
        self.in_check = threading.Event()

    def set(self, key, value):
        self.keys[key] = value.encode() if isinstance(value, str) else value

    def check(self, keys):
        self.in_check.set()
        time.sleep(self.delay)
        return all(k in self.keys for k in keys)

    def get(self, key):
        return self.keys[key]


def test_stop_returns_only_after_the_thread_has_left_its_store_call():
    dog = PeerWatchdog(rank=1, world_size=2, host="127.0.0.1", port=1, timeout_s=6)  # beats every 0.5 s
    dog._store = store = SlowStore(delay=3 * dog.interval * 2)  # longer than the join used to wait
    dog._thread.start()
    assert store.in_check.wait(10)
    dog.stop()
    assert not dog._thread.is_alive(), "stop() returned while the watchdog thread was still in a store call"
    assert store.keys[f"{_PREFIX}1"] == _DONE


def test_a_stopped_watchdog_reads_no_further_peer():
    """Stopped between two peers' reads, the thread makes no further call (each may take a store timeout)."""
    dog = PeerWatchdog(rank=0, world_size=4, host="127.0.0.1", port=1, timeout_s=6)
    dog._store = store = SlowStore(delay=0.0)
    calls = []
    store.check = lambda keys: calls.append(keys) or dog._stopped.set() or False  # stop() comes during the call
    assert dog._read({1: "a", 2: "b", 3: "c"}) == {1: None}
    assert calls == [["a"]]


_RANK = textwrap.dedent(
    """
    import logging, sys, time
    sys.path.insert(0, {root!r})
    from trainer.run.watchdog import PeerWatchdog
    logging.basicConfig(format="%(levelname)s: %(message)s")
    dog = PeerWatchdog(1, 2, "127.0.0.1", int(sys.argv[1]), timeout_s=6).start()
    time.sleep(1)
    print("beating", flush=True)
    time.sleep(120)  # the main thread waits in a collective that rank 0 will never join
    """
)

_HOST = textwrap.dedent(
    """
    import time, torch.distributed as dist
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    print(store.port, flush=True)
    for beat in range(3000):  # rank 0 beats too, until it is frozen: only the store's silence can end rank 1
        store.set("colbert-k8s/heartbeat/0", str(beat))
        time.sleep(0.2)
    """
)


@pytest.mark.slow
def test_a_frozen_store_host_is_noticed_although_its_calls_never_return():
    """Rank 0 frozen (its store host with it): the heartbeat thread's call blocks for good; the rank still
    exits 129 (retryable) with one line, within the peer timeout, not after the collective's 30 minutes."""
    host = subprocess.Popen([sys.executable, "-c", _HOST], stdout=subprocess.PIPE, text=True)
    try:
        port = host.stdout.readline().strip()
        rank = subprocess.Popen(
            [sys.executable, "-c", _RANK.format(root=str(ROOT)), port],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert rank.stdout.readline().strip() == "beating"
        host.send_signal(signal.SIGSTOP)
        try:
            _, err = rank.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            rank.kill()
            pytest.fail("a rank whose store host froze was not ended by its watchdog within 60 s")
        assert rank.returncode == EXIT_PEER_LOST, err[-2000:]
        assert "(rank 0) has not answered for 6s (distributed.peer_timeout_seconds)" in err, err[-2000:]
    finally:
        host.kill()
        host.wait()
