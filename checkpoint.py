"""Checkpoints: written atomically, read with ``weights_only=True``, and resumed.

A checkpoint is a dict of state dicts, tensors and plain values::

    {'model': ..., 'optimizer': ..., 'epoch': int, 'config': {flag: value},
     'rng': {...}, 'extra': {...}}

so ``torch.load(..., weights_only=True)`` reads it. Checkpoints of the original
SupContrast pickle an ``argparse.Namespace`` under ``'opt'``; that single class is
allow-listed for loading them (never ``weights_only=False``).
"""
import argparse
import os
import tempfile

import torch

from networks import build_encoder
from util import UserError, prepare_model

WRAPPER_PREFIXES = ('module', '_orig_mod')  # DataParallel / DDP and torch.compile


def save_checkpoint(path, state):
    """Write ``state`` to ``path`` through a temporary file and a rename, so a crash never leaves half a file."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix='.tmp_', suffix='.pth')
    try:
        with os.fdopen(fd, 'wb') as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        if os.path.exists(tmp):
            os.remove(tmp)
        if isinstance(e, (OSError, RuntimeError)):   # disk full, quota, I/O error (torch wraps some as RuntimeError)
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise UserError(f'cannot write checkpoint {path} ({reason}); the previous one is intact') from None
        raise


def load_checkpoint(path, what='checkpoint'):
    """Read a checkpoint onto the CPU; missing or unreadable files are a :class:`UserError`."""
    if not path or not os.path.isfile(path):
        raise UserError(f'{what} not found: {path!r}')
    try:
        with torch.serialization.safe_globals([argparse.Namespace]):
            ckpt = torch.load(path, map_location='cpu', weights_only=True)
    except Exception as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f'cannot read {what} {path}: {reason[:200]}') from None
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


def load_model_state(model, ckpt, opt, path, what='checkpoint'):
    """Load ``ckpt['model']`` into ``model``; a model mismatch is a one-line :class:`UserError`."""
    saved = ckpt['config'].get('model')
    if saved and saved != opt.model:
        raise UserError(f'{what} {path} holds a {saved} model but --model is {opt.model}')
    state = clean_state_dict(ckpt['model'])
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        n = str(e).count('size mismatch') + str(e).count('Missing key') + str(e).count('Unexpected key')
        raise UserError(f'{what} {path} does not match --model {opt.model} '
                        f'({n} kinds of missing, unexpected or mis-shaped weights)') from None


def load_encoder(opt, default_model):
    """The frozen encoder of ``opt.ckpt`` on ``opt.device``. ``--model`` (``opt.model``) defaults to the
    checkpoint's, else to ``default_model``; a mismatch is a one-line :class:`UserError`."""
    ckpt = load_checkpoint(opt.ckpt, 'stage-1 checkpoint (--ckpt)')
    saved = ckpt['config'].get('model')
    if opt.model is None:
        opt.model = saved or default_model
    elif saved and saved != opt.model:
        raise UserError(f'--ckpt {opt.ckpt} holds a {saved} encoder but --model is {opt.model}')
    state = {k[len('encoder.'):]: v for k, v in clean_state_dict(ckpt['model']).items()
             if k.startswith('encoder.')}
    if not state:
        raise UserError(f'--ckpt {opt.ckpt} has no encoder weights (no "encoder." keys)')
    encoder, _ = build_encoder(opt.model)
    try:
        encoder.load_state_dict(state)
    except RuntimeError:
        raise UserError(f'--ckpt {opt.ckpt} does not match --model {opt.model}') from None
    encoder = prepare_model(opt, encoder).eval()
    for p in encoder.parameters():
        p.requires_grad_(False)
    return encoder
