"""A tar streamed out of a pod, read as it arrives, and extracted without trusting it (``colbert-k8s fetch``).

* :class:`ExecStream`: an exec's binary stdout as a file (for tarfile's stream mode), its stderr and exit
  status kept aside, a silent pod one line;
* :func:`extract`: plain files and directories only under the names asked for, no absolute path, no ``..``,
  no link of any kind, no device; every member checked before any is placed (tarfile parses, nothing more);
* :func:`staged`: the copy is built in a temporary sibling of its destination and renamed into place whole.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import tarfile
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath
from typing import IO, Any

from operator_cli.errors import CliError

__all__ = ["ExecStream", "check_destination", "extract", "send_tree", "staged", "tree_bytes"]

WRITE_FRAME = 1 << 20  # bytes per websocket frame written to a pod's stdin


# ---- an exec's stdout as a file ------------------------------------------------------------------------------------


class ExecStream:
    """An exec's stdout as a file for tarfile's stream mode (``read``); its stderr and exit status kept aside.

    It reads websocket-client's frames itself (``recv_data_frame``: one channel byte, then the bytes): the
    kubernetes client's ``WSClient`` keeps a second copy of all stdout in memory (``capture_all``, which
    ``stream()`` cannot turn off) and joins frames by concatenation, right for a command's output, not for
    gigabytes of model. ``sock`` is that websocket, with its timeout set (a stalled pod is one line)."""

    def __init__(self, sock: Any, what: str, progress: Callable[[int], Any] | None = None):
        self.sock, self.what, self.progress = sock, what, progress or (lambda n: None)
        self._out, self._err, self._status = bytearray(), bytearray(), bytearray()
        self._open = True

    def read(self, size: int = -1) -> bytes:
        while self._open and (size < 0 or len(self._out) < size):
            if not self._receive() and self._out:
                break  # a short read is fine; wait only when there is nothing to give
        size = len(self._out) if size < 0 else min(size, len(self._out))
        data = bytes(self._out[:size])
        del self._out[:size]
        return data

    def write(self, data: bytes) -> int:
        """Bytes to the command's stdin (channel 0), for tarfile's stream mode (``upload``)."""
        from websocket import ABNF

        for start in range(0, len(data), WRITE_FRAME):
            chunk = data[start : start + WRITE_FRAME]
            self.sock.send(b"\x00" + chunk, opcode=ABNF.OPCODE_BINARY)
            self.progress(len(chunk))
        return len(data)

    def close_stdin(self) -> None:
        """The end of stdin: a v5 channel close (older servers ignore it; ``upload``'s pod stops reading at
        the stream's own end frame anyway)."""
        from websocket import ABNF

        with contextlib.suppress(Exception):
            self.sock.send(bytes([255, 0]), opcode=ABNF.OPCODE_BINARY)

    def _receive(self) -> bool:
        """One frame into its channel's buffer; False when it brought no stdout."""
        from websocket import ABNF, WebSocketConnectionClosedException, WebSocketTimeoutException

        try:
            opcode, frame = self.sock.recv_data_frame()
        except WebSocketTimeoutException:
            raise CliError(
                f"{self.what}: the pod sent nothing for {self.sock.gettimeout():g}s",
                hint="the node or the API server may be overloaded; run fetch again",
            ) from None
        except (WebSocketConnectionClosedException, ConnectionError):
            self._open = False
            return False
        if opcode == ABNF.OPCODE_CLOSE:
            self._open = False
            return False
        data = bytes(frame.data or b"")
        channel, payload = (data[0], data[1:]) if data else (None, b"")
        if channel == 1:
            self._out += payload
            self.progress(len(payload))
            return bool(payload)
        if channel == 2:
            self._err += payload
            del self._err[:-4096]  # the last lines say why
        elif channel == 3:  # the command's exit status (a metav1.Status), just before the close
            self._status += payload
        return False  # 255: a v5 channel close; 0 and 4 are ours to write

    def finish(self) -> None:
        """Read to the end (a tar's padding), then one line unless the command exited 0."""
        while self._open:
            self._receive()
            self._out.clear()
        try:
            status = json.loads(bytes(self._status)) if self._status else None
        except ValueError:
            status = {"message": bytes(self._status[:200]).decode("utf-8", "replace")}
        if isinstance(status, dict) and status.get("status") == "Success":
            return
        if not isinstance(status, dict):
            raise CliError(
                f"{self.what}: the stream ended before the command's exit status (the pod was stopped: its "
                "deadline passed, or its node went away)",
                hint="run fetch again (with a larger --timeout for large outputs)",
            )
        causes = (status.get("details") or {}).get("causes") or []
        code = next((c.get("message") for c in causes if c.get("reason") == "ExitCode"), None)
        lines = [line for line in self._err.decode("utf-8", "replace").splitlines() if line.strip()]
        why = lines[-1] if lines else status.get("message") or "no reason given"
        raise CliError(f"{self.what} failed" + (f" (exit code {code})" if code else "") + f": {why[:300]}")

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.sock.close()


# ---- a local tree into a pod ----------------------------------------------------------------------------------


class _Buffered:
    """tarfile writes 10 KiB records; a pod's stdin takes frames of :data:`WRITE_FRAME`."""

    def __init__(self, out: IO[bytes]):
        self.out, self.buf = out, bytearray()

    def write(self, data: bytes) -> int:
        self.buf += data
        if len(self.buf) >= WRITE_FRAME:
            self.flush()
        return len(data)

    def flush(self) -> None:
        if self.buf:
            self.out.write(bytes(self.buf))
            self.buf.clear()


def send_tree(local: Path, out: IO[bytes], arcname: str) -> None:
    """``local`` (a file or a directory, links followed: their content is what the job reads) as a tar
    stream written to ``out`` in pieces of :data:`WRITE_FRAME`, whose one top-level member is ``arcname``;
    only files and directories, as ``extract`` takes. A local read error is raised as tarfile raises it."""
    buffered = _Buffered(out)
    with tarfile.open(fileobj=buffered, mode="w|", format=tarfile.PAX_FORMAT, dereference=True) as tar:
        tar.add(local, arcname=arcname, filter=lambda m: m if m.isreg() or m.isdir() else None)
    buffered.flush()


def tree_bytes(local: Path) -> int:
    """The bytes :func:`send_tree` reads, for a progress bar."""
    if local.is_file():
        return local.stat().st_size
    return sum(p.stat().st_size for p in local.rglob("*") if p.is_file())


# ---- safe extraction ---------------------------------------------------------------------------------------


def check_destination(to: Path, overwrite: bool) -> None:
    """Before any request: ``--to`` is free (absent or an empty directory), or ``--overwrite`` replaces it."""
    if to.is_symlink() or (to.exists() and not (to.is_dir() and not any(to.iterdir()))):
        if not overwrite:
            raise CliError(
                f"--to {to} exists and is not an empty directory",
                hint="pass another --to, or --overwrite to replace it once the new copy is whole",
            )
    at = to.absolute().parent
    while not at.exists() and at != at.parent:
        at = at.parent
    if not (at.is_dir() and os.access(at, os.W_OK | os.X_OK)):
        raise CliError(f"--to {to}: cannot create it in {at}", hint="pass a directory you can write to")


@contextlib.contextmanager
def staged(to: Path, overwrite: bool) -> Iterator[Path]:
    """A new directory beside ``to``, renamed to ``to`` once the block succeeds; removed if it fails."""
    to.parent.mkdir(parents=True, exist_ok=True)
    tmp = to.parent / f".{to.name}.fetch-{secrets.token_hex(4)}"
    tmp.mkdir()
    try:
        yield tmp
        old = None
        if to.is_symlink() or to.exists():
            check_destination(to, overwrite)  # again: something may have appeared there meanwhile
            old = to.parent / f".{to.name}.old-{secrets.token_hex(4)}"
            os.replace(to, old)
        os.replace(tmp, to)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old) if old.is_dir() and not old.is_symlink() else old.unlink()


def extract(fileobj: IO[bytes], dest: Path, names: set[str], what: str) -> None:
    """A tar stream into ``dest``: files and directories under ``names`` only, all checked before any is placed.

    tarfile only parses here: every path is made by this function (no ``extractall``, no ``data_filter``,
    whose link checks CPython before 3.11.13/3.12.11/3.13.4 let a symlink chain past PATH_MAX escape,
    CVE-2025-4517), so it needs no Python floor. A file's bytes are spooled, as they stream, into
    ``dest/.fetch-spool/`` under a number; only when the last member has passed are they renamed to
    their names. A refusal or a cut stream leaves ``dest`` as it was; under :func:`staged`, so does any failure."""
    spool = dest / ".fetch-spool"  # no member's name: each must start with one of ``names``
    spool.mkdir()
    try:
        with tarfile.open(fileobj=fileobj, mode="r|") as tar:
            members = _spooled(tar, spool, names, what)
        _place(members, dest)
    except tarfile.TarError as e:
        raise CliError(
            f"{what}: the archive is cut short or corrupt ({e}); nothing was written", hint="run fetch again"
        ) from None
    except OSError as e:
        raise CliError(
            f"cannot write into {dest.parent}: {e.strerror or e}; nothing was written",
            hint="free some space or pass another --to",
        ) from None
    finally:
        shutil.rmtree(spool, ignore_errors=True)


def _spooled(tar: tarfile.TarFile, spool: Path, names: set[str], what: str) -> list[tuple]:
    """Every member checked as it arrives, a file's bytes copied to ``spool``; [(path, member, spooled file)]."""
    members: list[tuple[PurePosixPath, tarfile.TarInfo, Path | None]] = []
    files: set[PurePosixPath] = set()
    dirs: set[PurePosixPath] = set()
    for member in tar:
        path = PurePosixPath(member.name)
        problem = _problem(member, path, names)
        if problem is None and (path in files or (path in dirs and not member.isdir())):
            problem = "a name given twice"
        if problem is None and (under := next((p for p in path.parents if p in files), None)):
            problem = f"a path under the file {str(under)[:120]!r}"
        if problem is not None:
            raise CliError(
                f"{what}: the archive holds {member.name[:120]!r}, {problem}; refused, nothing was written",
                hint="the job's output directory holds something unexpected; inspect it with kubectl",
            )
        blob = None
        if member.isreg():
            blob = spool / str(len(members))
            with tar.extractfile(member) as src, open(blob, "xb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
            files.add(path)
        dirs.update(path.parents[:-1])
        dirs.update([path] if member.isdir() else [])
        members.append((path, member, blob))
    return members


def _problem(member: tarfile.TarInfo, path: PurePosixPath, names: set[str]) -> str | None:
    """Why a member is refused, or None: only plain files and directories, under ``names``, come out."""
    if path.is_absolute():
        return "an absolute path"
    if ".." in path.parts:
        return "a '..' component"
    if not path.parts or path.parts[0] not in names or "\0" in member.name:
        return f"a path outside {', '.join(sorted(names))}"
    if member.issym() or member.islnk():
        return "a link (fetch copies files and directories only; the trainer writes no links)"
    if member.ischr() or member.isblk() or member.isfifo():
        return "a device or pipe"
    if not (member.isreg() or member.isdir()):
        return f"a member of tar type {member.type!r}"
    return None


def _place(members: list[tuple], dest: Path) -> None:
    """The checked members at their names: directories made, spooled files renamed in, modes and times set
    (tarfile's ``data`` filter's modes: no setuid, no write for group or others)."""
    for path, member, blob in members:
        target = dest.joinpath(*path.parts)
        if blob is None:
            target.mkdir(parents=True, exist_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        mode = (member.mode & 0o755) | 0o600
        os.chmod(blob, mode if mode & 0o100 else mode & ~0o111)
        _touch(blob, member.mtime)
        os.replace(blob, target)
    for path, member, blob in sorted(members, key=lambda m: -len(m[0].parts)):
        if blob is None:  # deepest first: making a child changes its parent's time
            _touch(dest.joinpath(*path.parts), member.mtime)


def _touch(path: Path, mtime: float) -> None:
    with contextlib.suppress(OverflowError, ValueError):  # a time no file can have: the file keeps its own
        os.utime(path, (mtime, mtime))
