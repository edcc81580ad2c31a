"""The command line's run-time side (:func:`run_cli`): a :class:`flags.UserError` as one line on stderr with exit
status 2, Ctrl-C and SIGTERM as one line saying how to continue the run (exit 130 and 143), and under torchrun a dead
peer as one line instead of gloo's or NCCL's traceback."""
import gc
import os
import re
import signal
import sys

from core.flags import UserError
from runtime.run_folder import interrupt_message, release_run_folder
from tracking.trackers import finish as finish_trackers


class Interrupted(KeyboardInterrupt):
    """SIGTERM, raised where the program is (as Ctrl-C raises KeyboardInterrupt)."""


_MAIN_PID = os.getpid()


def _raise_interrupted(signum, frame):
    """SIGTERM and SIGINT: the first raises where the program is (:class:`Interrupted`, ``KeyboardInterrupt``) and
    makes the process ignore the rest, so a burst of signals gives one message while the run winds down (a
    signal raised in a finalizer or at exit would print an 'Exception ignored' traceback each)."""
    if os.getpid() != _MAIN_PID:       # a forked DataLoader worker: as by default
        if signum == signal.SIGINT:
            raise KeyboardInterrupt()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        return
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise Interrupted() if signum == signal.SIGTERM else KeyboardInterrupt()


def error_line(error):
    """The one line of a :class:`UserError`, also one re-raised by a DataLoader worker (whose message
    holds the worker's traceback: the original message is its last line)."""
    message = str(error).strip()
    if '\n' in message:
        message = message.splitlines()[-1].split('UserError: ', 1)[-1]
    return message


def close_trackers(status):
    """Finish the run's open W&B and MLflow runs as ``FAILED`` or ``KILLED`` (a run that ends well finishes them
    with its results); a tracker that cannot be reached now does not hide the run's own error."""
    try:
        finish_trackers(status=status)
    except Exception:
        pass


def run_cli(main):
    """Run ``main()``; a :class:`UserError`, Ctrl-C or SIGTERM becomes a one-line message and a non-zero exit."""
    prog = os.path.basename(sys.argv[0])
    signal.signal(signal.SIGTERM, _raise_interrupted)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:    # not where SIGINT is ignored (nohup, &)
        signal.signal(signal.SIGINT, _raise_interrupted)
    import torch.distributed as dist  # here, not at the top: sweep.py --status reads error_line without torch

    ended_well = False
    try:
        main()
        ended_well = True
    except UserError as e:
        close_trackers('FAILED')
        print(f'{prog}: error: {error_line(e)}', file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt as e:
        close_trackers('KILLED')
        under_torchrun = isinstance(e, Interrupted) and int(os.environ.get('WORLD_SIZE', '1')) > 1
        print(f'{prog}: ' + interrupt_message('interrupted (torchrun stops every process when one fails or when it is '
                                              'stopped itself)' if under_torchrun else 'interrupted'), file=sys.stderr)
        sys.exit(143 if isinstance(e, Interrupted) else 130)
    except Exception as e:
        close_trackers('FAILED')
        if not (dist.is_available() and dist.is_initialized() and peer_died(e)):
            raise
        detail = re.sub(r'^\[[^\]]*\]\s*', '', error_line(e)).split('. ')[0][:100]      # gloo: [file:line] text.
        print(f'{prog}: error: ' + interrupt_message(f'another torchrun process died ({detail}; torchrun\'s report '
                                                    f'names it)'), file=sys.stderr)
        sys.exit(1)
    finally:
        # the process is ending: a signal now (torchrun stopping the other processes) has nothing left to interrupt
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        release_run_folder()
        if dist.is_available() and dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception:      # a process group whose peer is gone may not shut down cleanly: nothing to add
                pass
            if ended_well:
                end_process_groups()


def end_process_groups():
    """Free the process groups that ``destroy_process_group`` let go of, now. A run's objects hold the group in
    reference cycles, so it would be freed during the interpreter's shutdown, where a gloo worker thread that drops
    its last finished collective (tensors with Python objects) cannot take the GIL and aborts the process (SIGABRT,
    "terminate called without an active exception", after a run that ended well). Freed here, the group joins its
    threads while the interpreter is whole. After a good run only: no collective is left running."""
    gc.collect()


PEER_FAILURES = ('Connection reset by peer', 'Connection closed by peer', 'Broken pipe', 'Connection refused',
                 'communicator was aborted', 'NCCL communicator', 'Socket Timeout')


def peer_died(error):
    """Whether ``error``, raised by a collective under torchrun, says that another process of the group is gone
    (gloo's and NCCL's wordings) rather than that this one failed."""
    text = f'{type(error).__name__}: {error}'
    return isinstance(error, RuntimeError) and any(w in text for w in PEER_FAILURES)
