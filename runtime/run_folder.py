"""A run's folder (docs/USAGE.md, "Run folders"): its name fitted to a file name (:func:`fit_name`), the check that it
can be written before any work (:func:`writable_folder`), the lock that gives it to one process
(:func:`hold_run_folder`), and what an interrupted run says about it (:func:`interrupt_message`)."""
import hashlib
import os
import socket
import sys
import time

from core.flags import UserError

# The run folder of this process's run, set by ``engine.setup``: an interrupt says how to continue it; the open
# file of the folder's lock (:func:`hold_run_folder`), closed when the script ends.
RUN = {'folder': None, 'lock': None}
RUN_IDENTITY = 'run.json'        # the experiment a run folder holds: its name in full and its flags


def lock_folder(folder):
    """``(file, None)``: this process now holds ``<folder>/.lock`` (an exclusive ``flock``, released by the system
    when the process ends, however it ends, or when the file is closed), with its pid, host, start time and command
    line written into it; or ``(None, holder)`` without waiting, ``holder`` being what the file says of the process
    that holds it. ``(None, None)`` where the system has no ``flock`` (nothing is locked there)."""
    try:
        import fcntl
    except ImportError:
        return None, None
    f = open(os.path.join(folder, '.lock'), 'a+')
    try:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        f.seek(0)
        holder = f.read().strip() or 'another process'
        f.close()
        return None, holder
    f.seek(0)
    f.truncate()
    f.write(f'pid {os.getpid()} on {socket.gethostname()} since {time.strftime("%Y-%m-%d %H:%M:%S")} '
            f'({" ".join(os.path.basename(a) if i == 0 else a for i, a in enumerate(sys.argv))[:300]})\n')
    f.flush()
    return f, None


def is_held(folder):
    """Whether a process holds ``<folder>/.lock`` now (:func:`lock_folder`), looked at without taking it for long."""
    if not os.path.isfile(os.path.join(folder, '.lock')):
        return False
    f, holder = lock_folder(folder)
    if f is not None:
        f.close()
    return holder is not None


def hold_run_folder(folder):
    """Take the lock of the run folder ``folder`` for this run (:func:`lock_folder`). Returns ``None``, or, without
    waiting, why the folder cannot be had: its holder's pid, host, start time and command line."""
    release_run_folder()       # one folder per process (and flock would refuse a second open of the same file)
    f, holder = lock_folder(folder)
    if holder is not None:
        return (f'{folder} is in use by {holder}: wait for it to finish, or start this run with a new --trial or '
                f'--save_folder')
    RUN['lock'] = f
    return None


def release_run_folder():
    """Give the run folder's lock back (a script run in-process, as the tests run some, outlives its run)."""
    if RUN['lock'] is not None:
        RUN['lock'].close()
        RUN['lock'] = None


def interrupt_message(what='interrupted'):
    """What a run stopped by ``what`` prints: how to continue it (``--resume``), or that nothing was saved yet."""
    folder = RUN['folder']
    last = os.path.join(folder, 'last.pth') if folder else None
    if last and os.path.isfile(last):
        return f'{what}; the last complete checkpoint is intact: continue with --resume {last}'
    return f'{what} before the first checkpoint (written after each epoch): nothing to resume'


def writable_folder(folder, flag):
    """Create ``folder`` (and its parents) and check that a file can be written there, before any work; a
    :class:`UserError` naming ``flag`` otherwise."""
    import tempfile
    try:
        os.makedirs(folder, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        raise UserError(f'cannot write to {folder} ({e.strerror or type(e).__name__}); choose another {flag}') \
            from None
    return folder


NAME_MAX = 255     # bytes of one file name on common file systems (ext4, XFS, APFS, NTFS)
HASH_CHARS = 12


def fit_name(name, limit=NAME_MAX):
    """``name`` if it fits in ``limit`` bytes; otherwise its first bytes and ``_`` and the first 12 hex digits of its
    SHA-1 (stable: the same settings always give the same folder, and different ones differ). The full name is
    in the folder's ``run.json`` (``engine.prepare_run_folder``)."""
    encoded = name.encode()
    if len(encoded) <= limit:
        return name
    digest = hashlib.sha1(encoded).hexdigest()[:HASH_CHARS]
    head = encoded[:limit - HASH_CHARS - 1].decode(errors='ignore')
    return f'{head}_{digest}'
