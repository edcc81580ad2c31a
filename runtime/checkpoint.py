"""Checkpoints: written atomically, read with ``weights_only=True``, and resumed.

A checkpoint is a dict of state dicts, tensors and plain values::

    {'model': ..., 'optimizer': ..., 'epoch': int, 'config': {flag: value},
     'rng': {...}, 'extra': {...}}

so ``torch.load(..., weights_only=True)`` reads it. Checkpoints of the original
SupContrast pickle an ``argparse.Namespace`` under ``'opt'``; that single class is
allow-listed for loading them (never ``weights_only=False``).
"""
import argparse
import errno
import io
import os
import re
import tempfile
import warnings

import torch

from core.flags import UserError
from networks import build_encoder

WRAPPER_PREFIXES = ('module', '_orig_mod')  # DataParallel / DDP and torch.compile


def save_checkpoint(path, state):
    """Write ``state`` to ``path`` through a temporary file and a rename, so a crash never leaves half a file.

    The checkpoint is serialized in memory first and written with plain file I/O, so a failing write
    (disk full, quota, I/O error) is an ``OSError`` with its errno, which becomes one line naming the cause
    and whether an earlier checkpoint is still there (torch's own writer reports a full disk as an internal
    zip-position error)."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    buffer = io.BytesIO()
    torch.save(state, buffer)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix='.tmp_', suffix='.pth')
    try:
        os.chmod(tmp, 0o666 & ~current_umask())        # mkstemp makes it 0600: the mode of any other file instead
        with os.fdopen(fd, 'wb') as f:
            f.write(buffer.getbuffer())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        if os.path.exists(tmp):
            os.remove(tmp)
        if isinstance(e, OSError):
            raise UserError(f'cannot write checkpoint {path} ({write_failure(e, folder, len(buffer.getbuffer()))}); '
                            + ('the previous one is intact' if os.path.isfile(path) else 'nothing was saved yet')) \
                from None
        raise


def current_umask():
    """The process's umask (read by setting it and back: there is no getter)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_failure(e, folder, size):
    """Why writing ``size`` bytes into ``folder`` failed, in words (the OS reason, and free space when it ran out)."""
    reason = e.strerror or str(e) or type(e).__name__
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        try:
            free = os.statvfs(folder)
            free_mb = free.f_bavail * free.f_frsize / 2**20
            reason += f': {size / 2**20:.1f} MB to write, {free_mb:.1f} MB free in {folder}'
        except OSError:
            pass
    return reason


def read_failure(path, e):
    """Why ``torch.load`` could not read ``path``, in words: not a checkpoint at all, a truncated archive, or a
    pickle that a weights-only load refuses."""
    message = str(e).strip()
    try:
        with open(path, 'rb') as f:
            head = f.read(8)
    except OSError as err:
        return err.strerror or str(err)
    if not head:
        return 'the file is empty'
    if head.startswith(b'PK'):                           # torch.save's zip archive
        if 'central directory' in message or 'zip archive' in message:
            return 'the zip archive is incomplete (truncated, or still being written)'
    elif head.startswith(b'\x80'):                       # a pickle: torch.save's legacy format, or plain pickle
        found = re.search(r'Unsupported global: GLOBAL ([\w.]+)', message)
        return (f'it holds a {found.group(1)} object, which a weights-only load refuses' if found else
                'it is a pickle that torch.load cannot read with weights_only=True (not written by torch.save?)')
    else:
        return f'it is not a PyTorch checkpoint (torch.save writes a zip archive; this file starts with {head!r})'
    return (message.splitlines()[0] if message else type(e).__name__)[:200]


def run_checkpoint(path, flag):
    """``path`` where a checkpoint is expected (``--ckpt``, ``--resume``); a run folder stands for its ``last.pth``,
    said in one line. A folder without one is a :class:`UserError`."""
    if not path or not os.path.isdir(path):
        return path
    last = os.path.join(path, 'last.pth')
    if not os.path.isfile(last):
        raise UserError(f'{flag} {path} is a folder without a last.pth: give a checkpoint file (a run folder\'s '
                        'last.pth or ckpt_epoch_N.pth)')
    if os.environ.get('RANK', '0') == '0':
        print(f'note: {flag} {path} is a run folder: its last.pth', flush=True)
    return last


def load_checkpoint(path, what='checkpoint'):
    """Read a checkpoint onto the CPU; missing or unreadable files are a :class:`UserError`."""
    if not path or not os.path.isfile(path):
        raise UserError(f'{what} not found: {path!r}')
    try:
        with torch.serialization.safe_globals([argparse.Namespace]), warnings.catch_warnings():
            warnings.filterwarnings('ignore', message='Detected pickle protocol')   # a plain pickle: said below
            ckpt = torch.load(path, map_location='cpu', weights_only=True)
    except Exception as e:
        raise UserError(f'cannot read {what} {path}: {read_failure(path, e)}') from None
    if not isinstance(ckpt, dict) or 'model' not in ckpt:
        raise UserError(f'{what} {path} has no model state (expected a dict with a "model" entry)')
    if 'config' not in ckpt and isinstance(ckpt.get('opt'), argparse.Namespace):
        ckpt['config'] = dict(vars(ckpt['opt']))  # original SupContrast checkpoint
    ckpt.setdefault('config', {})
    return ckpt


def clean_state_dict(state_dict):
    """Drop DataParallel/DDP ``module.`` and ``torch.compile`` ``_orig_mod.`` components from keys."""
    return {'.'.join(p for p in key.split('.') if p not in WRAPPER_PREFIXES): value
            for key, value in state_dict.items()}


def load_model_state(model, ckpt, model_name, path, what='checkpoint'):
    """Load ``ckpt['model']`` into ``model`` (a ``--model model_name``); a mismatch is a one-line :class:`UserError`."""
    saved = ckpt['config'].get('model')
    if saved and saved != model_name:
        raise UserError(f'{what} {path} holds a {saved} model but --model is {model_name}')
    state = clean_state_dict(ckpt['model'])
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        n = str(e).count('size mismatch') + str(e).count('Missing key') + str(e).count('Unexpected key')
        raise UserError(f'{what} {path} does not match --model {model_name} '
                        f'({n} kinds of missing, unexpected or mis-shaped weights)') from None


def saved_encoder(ckpt, model_name, path, flag='--ckpt'):
    """``(encoder, feature dim, its state dict)`` of a checkpoint of any of the three scripts: the ``encoder.``
    weights, loaded into a ``model_name`` encoder built as the checkpoint's configuration says it was trained (before
    --stem existed: CIFAR's stem). A checkpoint without encoder weights, a model (a timm model or ``--model_args``
    entry) this timm cannot build, and weights of another architecture are one line each, naming ``flag path``."""
    state = {k[len('encoder.'):]: v for k, v in clean_state_dict(ckpt['model']).items() if k.startswith('encoder.')}
    if not state:
        raise UserError(f'{flag} {path} holds no encoder weights (no "encoder." keys): is it a stage-1 or main_ce.py '
                        'checkpoint?')
    config = ckpt['config']
    model_args = config.get('model_args') or ''
    try:
        encoder, dim = build_encoder(model_name, stem=config.get('stem') or 'cifar', size=config.get('size') or 32,
                                     model_args=model_args)
    except Exception as e:             # a timm model or argument this timm does not have
        reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise UserError(f'{flag} {path} holds a {model_name} encoder'
                        + (f' with --model_args {model_args}' if model_args else '')
                        + f' that cannot be built here ({reason})') from None
    try:
        encoder.load_state_dict(state)
    except RuntimeError:
        raise UserError(f'{flag} {path} does not match a {model_name} encoder (its weights do not fit)') from None
    return encoder, dim, state


def load_encoder(path, model_name, default_model, runtime):
    """``(frozen encoder, model name)`` of the stage-1 checkpoint ``path`` (``--ckpt``), prepared by ``runtime``
    (a :class:`runtime.Runtime`). The model is ``model_name`` (``--model``), or when that is ``None`` the
    checkpoint's, else ``default_model``; a mismatch is a one-line :class:`UserError`."""
    ckpt = load_checkpoint(path, 'stage-1 checkpoint (--ckpt)')
    saved = ckpt['config'].get('model')
    if model_name is None:
        model_name = saved or default_model
    elif saved and saved != model_name:
        raise UserError(f'--ckpt {path} holds a {saved} encoder but --model is {model_name}')
    encoder, _, _ = saved_encoder(ckpt, model_name, path)
    encoder = runtime.prepare_model(encoder).eval()
    for p in encoder.parameters():
        p.requires_grad_(False)
    return encoder, model_name
