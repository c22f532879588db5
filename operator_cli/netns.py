"""``colbert-k8s local --isolate-network``: one network namespace per replica, as pods on separate hosts.

Loopback hides what breaks on real clusters: a master name that does not resolve, the wrong interface,
an unreachable port. Here each replica gets its own namespace with an ``eth0`` (one end of a veth pair
whose other end sits on a bridge in a switch namespace of its own), an address in a private /24 that
exists only inside these namespaces, and ``/etc/netns/<ns>/hosts`` mapping ``<job>-master-0`` and
``<job>-worker-<i>`` to those addresses. ``MASTER_ADDR`` is then the operator's real host name and gloo
and NCCL bind ``eth0``. No interface is added to the host's namespace; everything is removed afterwards,
on failure too. Needs root and iproute2 (``ip netns``) on Linux.
"""

from __future__ import annotations

import os
import secrets
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from operator_cli.errors import CliError

__all__ = ["Network", "available", "remove"]

NETNS_ETC = Path("/etc/netns")


def available() -> str | None:
    """None when isolation can run here, else the reason it cannot."""
    if not sys.platform.startswith("linux"):
        return "network namespaces need Linux"
    if os.geteuid() != 0:
        return "network namespaces need root"
    if not shutil.which("ip"):
        return "iproute2's `ip` command is not installed"
    probe = f"ck8s-probe-{secrets.token_hex(3)}"
    res = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if res.returncode != 0:
        return f"`ip netns add` failed: {res.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _ip(*args: str) -> None:
    res = subprocess.run(["ip", *args], capture_output=True, text=True)
    if res.returncode != 0:
        raise CliError(f"`ip {' '.join(args)}` failed: {res.stderr.strip()}")


@dataclass
class Network:
    tag: str
    switch: str
    namespaces: dict[str, str] = field(default_factory=dict)  # host name -> namespace
    hosts: dict[str, str] = field(default_factory=dict)  # host name -> address

    created: list[str] = field(default_factory=list)  # every namespace `ip netns add` made, in order

    @classmethod
    def create(
        cls, hostnames: list[str], domain: str | None = None, made: Callable[[str], None] = lambda ns: None
    ) -> Network:
        """``domain``: also resolve ``<host>.<domain>`` (a JobSet's headless service: ``<job>-node-0-0.<job>``).
        ``made``: called with each namespace as soon as it exists (``local``'s reaper hears of it at once)."""
        reason = available()
        if reason:
            raise CliError(f"--isolate-network is not possible here: {reason}", hint="run without --isolate-network")
        tag = secrets.token_hex(3)
        subnet = f"10.{200 + secrets.randbelow(50)}.{secrets.randbelow(256)}"
        net = cls(tag=tag, switch=f"ck8s-{tag}-sw")

        def add(ns: str) -> None:
            _ip("netns", "add", ns)
            net.created.append(ns)
            made(ns)

        try:
            add(net.switch)
            _ip("-n", net.switch, "link", "add", "br0", "type", "bridge")
            _ip("-n", net.switch, "link", "set", "br0", "up")
            for i, host in enumerate(hostnames):
                ns = f"ck8s-{tag}-{i}"
                add(ns)
                net.namespaces[host] = ns
                net.hosts[host] = f"{subnet}.{i + 1}"
                _ip("-n", net.switch, "link", "add", f"v{i}", "type", "veth", "peer", "name", "eth0", "netns", ns)
                _ip("-n", net.switch, "link", "set", f"v{i}", "master", "br0", "up")
                _ip("-n", ns, "addr", "add", f"{net.hosts[host]}/24", "dev", "eth0")
                _ip("-n", ns, "link", "set", "eth0", "up")
                _ip("-n", ns, "link", "set", "lo", "up")
            alias = (lambda h: f" {h}.{domain}") if domain else (lambda h: "")
            table = "127.0.0.1 localhost\n" + "".join(f"{a} {h}{alias(h)}\n" for h, a in net.hosts.items())
            for ns in net.namespaces.values():
                (NETNS_ETC / ns).mkdir(parents=True, exist_ok=True)
                (NETNS_ETC / ns / "hosts").write_text(table)
        except BaseException:
            net.destroy()
            raise
        return net

    def wrap(self, host: str, command: list[str]) -> list[str]:
        return ["ip", "netns", "exec", self.namespaces[host], *command]

    def destroy(self) -> None:
        """Remove every namespace (and so every veth) and hosts file this run created, and only those."""
        remove(self.created)


def remove(namespaces: list[str]) -> None:
    """Delete these namespaces and their hosts files; one already gone is skipped. Also the reaper's, for a
    ``local`` killed before its own clean-up (operator_cli/local/processes.py)."""
    for ns in namespaces:
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        shutil.rmtree(NETNS_ETC / ns, ignore_errors=True)
