"""An output folder belongs to one run at a time, and a new run never replaces an old one unasked.

The training, pre-training and experiment commands write into one folder (--out). Before they
write, `claimed(out, ...)` takes the folder's lock file, run.lock, which holds the PID, host and
command of the run; it is held (an fcntl lock on the file, where the system has them) until the
run ends, by an error or an interruption too, and removed then. A second run on the folder is
refused naming the first one's PID. A lock whose PID no longer runs on this host was left by a
killed run: it is taken over with a warning. A lock from another host cannot be checked and is
refused; the message says how to remove it.

Holding the lock, the command removes the half-written `<checkpoint>.tmp` folders a killed run left
(a checkpoint is written to .tmp and renamed into place when complete, see `vit_pytorch.checkpoint`,
so a .tmp folder never was the run's checkpoint), and refuses to start a new run over the files of
another (a finished or an interrupted one) unless the command says to continue that run or
`--overwrite` is given; `--overwrite` moves the old run's files to <out>/previous-<n>/, so that
nothing is lost unless its owner deletes it.
"""

import contextlib
import json
import os
import shutil
import socket
import sys
import time
from pathlib import Path

import torch

try:
    import fcntl
except ImportError:                                      # Windows: the PID in the file is the only guard
    fcntl = None

LOCK_FILE = 'run.lock'


def warn(line):
    """One warning line on stderr, for the commands (never from a model's forward)."""
    print(f"warning: {line}", file=sys.stderr, flush=True)


def _owner(text):
    """The run a lock file names: dict(pid, host, command, started), or None for an empty or unreadable file."""
    try:
        owner = json.loads(text)
    except json.JSONDecodeError:
        return None
    return owner if isinstance(owner, dict) and isinstance(owner.get('pid'), int) else None


def _describe(owner):
    return (f"PID {owner['pid']} on host {owner.get('host')!r} ({owner.get('command', 'a run')}, started "
            f"{owner.get('started', 'at an unknown time')})")


def _running(pid):
    """Whether process `pid` runs on this host (True where that cannot be checked)."""
    if os.name != 'posix':                               # os.kill(pid, 0) is no probe on Windows
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:                              # another user's process
        return True
    return True


def _open_locked(path, busy):
    """A descriptor of `path` holding its fcntl lock (where the system has one); `busy()` when another holds it."""
    while True:
        descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        if fcntl is None:
            return descriptor
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(descriptor)
            busy()
        except OSError:                                  # a file system without locks: the PID check remains
            return descriptor
        try:
            if os.fstat(descriptor).st_ino == os.stat(path).st_ino:
                return descriptor
        except FileNotFoundError:
            pass
        os.close(descriptor)                             # the holder removed this file as it ended: take the new one


@contextlib.contextmanager
def locked(out, *, command):
    """Hold <out>/run.lock for the with-block; a ValueError names the run that holds it."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / LOCK_FILE
    ours = dict(pid=os.getpid(), host=socket.gethostname(), command=command,
                started=time.strftime('%Y-%m-%d %H:%M:%S'))

    def busy(owner=None):
        if owner is None and path.exists():
            owner = _owner(path.read_text())
        holder = _describe(owner) if owner else 'another process'
        raise ValueError(f"--out {out} is in use by another run: {holder}; wait for it to end or give another "
                         f"--out (if no such run is alive, delete {path})")

    descriptor = _open_locked(path, busy)
    try:
        owner = _owner(os.read(descriptor, 1 << 16).decode(errors='replace'))
        if owner is not None and owner['pid'] != os.getpid():
            if owner.get('host') != ours['host'] or _running(owner['pid']):
                busy(owner)
            warn(f"took over {path} from {_describe(owner)}, which no longer runs: that run was killed")
        os.ftruncate(descriptor, 0)
        os.lseek(descriptor, 0, os.SEEK_SET)
        os.write(descriptor, (json.dumps(ours) + '\n').encode())
    except BaseException:
        os.close(descriptor)
        raise
    try:
        yield path
    finally:
        path.unlink(missing_ok=True)
        os.close(descriptor)


def remove_unfinished_saves(out, checkpoints):
    """Remove the `<name>.tmp` folders of the checkpoint `checkpoints` (glob patterns) in `out`, saying so."""
    for pattern in checkpoints:
        for staging in sorted(Path(out).glob(pattern + '.tmp')):
            if staging.is_dir():
                shutil.rmtree(staging)
                warn(f"removed {staging}, a checkpoint that a killed run left half-written (a checkpoint is "
                      f"written there first and renamed to {staging.name[:-len('.tmp')]} once complete)")


def run_files(out, names):
    """The files of a run in `out`: those matching `names` (glob patterns), an empty log.jsonl left out."""
    found = sorted({path for pattern in names for path in Path(out).glob(pattern)})
    return [path for path in found if not (path.name == 'log.jsonl' and path.stat().st_size == 0)]


def move_aside(out, files):
    """Move `files` into <out>/previous-<n>/ (the first free n); returns that folder."""
    number = 1
    while (Path(out) / f'previous-{number}').exists():
        number += 1
    folder = Path(out) / f'previous-{number}'
    folder.mkdir()
    for path in files:
        path.rename(folder / path.name)
    return folder


def check_new_run(out, *, names, continuing, overwrite, how_to_continue):
    """Refuse (a ValueError) a run that would write over the files of another run in `out` unless it
    continues that run or `overwrite` says to move them aside, which this then does."""
    files = run_files(out, names)
    if continuing:
        if overwrite:
            raise ValueError(f"--overwrite starts a new run in {out}, but this command continues the run there "
                             f"({how_to_continue}); leave out one of them")
        return
    if not files:
        return
    shown = ', '.join(path.name for path in files)
    if not overwrite:
        raise ValueError(f"--out {out} holds another run ({shown}); continue it with {how_to_continue}, "
                         f"or start a new one there with --overwrite (which moves those files to "
                         f"{out}/previous-<n>/), or give another --out")
    folder = move_aside(out, files)
    warn(f"--overwrite: moved the run that was in {out} ({shown}) to {folder}")


@contextlib.contextmanager
def claimed(out, *, command, names, checkpoints, continuing, overwrite, how_to_continue, rank=0, world_size=1):
    """The with-block owns `out`: locked, half-written checkpoints removed, no other run written over
    (see the module). Under torchrun only the first process does this; the others learn from it
    whether the run goes on, and a refusal stops them all."""
    with contextlib.ExitStack() as held:
        refused = None
        if rank == 0:
            try:
                held.enter_context(locked(out, command=command))
                remove_unfinished_saves(out, checkpoints)
                check_new_run(out, names=names, continuing=continuing, overwrite=overwrite,
                              how_to_continue=how_to_continue)
            except ValueError as refusal:
                if world_size == 1:
                    raise
                refused = refusal
        if world_size > 1:
            on = 'cuda' if torch.distributed.get_backend() == 'nccl' else 'cpu'
            verdict = torch.tensor([float(refused is not None)], device=on)
            torch.distributed.broadcast(verdict, src=0)
            if verdict.item():
                if rank == 0:
                    raise refused
                raise ValueError(f"the first process refused the run in {out} (its error says why)")
        yield Path(out)
