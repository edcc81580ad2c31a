"""Seeds and RNG states of a process: what checkpoints carry for an exact ``--resume`` (Python, NumPy, torch, CUDA,
and the registered generators such as the device augmentation's)."""
import random

import numpy as np
import torch


def set_seed(seed):
    random.seed(seed)
    np.random.seed(seed % 2 ** 32)
    torch.manual_seed(seed)


GENERATORS = {}     # name -> torch.Generator of this process whose state travels with the RNG states


def register_generator(name, generator):
    """Make ``generator``'s state part of :func:`get_rng_state` / :func:`set_rng_state` (checkpoints, ``--resume``)."""
    GENERATORS[name] = generator
    return generator


def get_rng_state():
    """All RNG states as tensors and plain values (loadable with ``weights_only=True``). CUDA: the state of this
    process's device only (``cuda_device``: its index), so that a checkpoint resumes on a node with any number of
    visible GPUs; registered generators with their device type."""
    np_state = np.random.get_state()
    state = {'torch': torch.get_rng_state(), 'python': random.getstate(),
             'numpy': {'keys': torch.from_numpy(np_state[1].astype(np.int64)), 'pos': int(np_state[2]),
                       'has_gauss': int(np_state[3]), 'cached_gaussian': float(np_state[4])}}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state['cuda'] = torch.cuda.get_rng_state(torch.cuda.current_device())
        state['cuda_device'] = torch.cuda.current_device()
    if GENERATORS:
        state['generators'] = {name: g.get_state() for name, g in GENERATORS.items()}
        state['generator_devices'] = {name: g.device.type for name, g in GENERATORS.items()}
    return state


def cuda_state_for_this_device(state, device_index):
    """The saved CUDA RNG state to restore on device ``device_index``, or ``None`` with the reason. A state saved
    by this project is one device's (``state['cuda']`` a tensor); older checkpoints hold a list of every visible
    device's: take entry ``device_index`` when it exists."""
    saved = state.get('cuda')
    if saved is None:
        return None, 'the checkpoint holds no CUDA RNG state (written on a CPU)'
    if isinstance(saved, torch.Tensor) and saved.dim() == 1:
        return saved, None
    saved = list(saved)
    if device_index < len(saved):
        return saved[device_index], None
    return None, f'the checkpoint holds CUDA RNG states of {len(saved)} devices, none for cuda:{device_index}'


def set_rng_state(state, reseed=None):
    """Restore :func:`get_rng_state`'s ``state``. A part that cannot be restored here (a CUDA state without a
    matching device, a generator saved on another device type) is re-seeded with ``reseed`` (an int) instead
    of failing. Returns the notices (one line each) of what was re-seeded."""
    notices = []
    torch.set_rng_state(state['torch'])
    py = state['python']
    random.setstate((py[0], tuple(py[1]), py[2]))
    n = state['numpy']
    np.random.set_state(('MT19937', n['keys'].numpy().astype(np.uint32), n['pos'],
                         n['has_gauss'], n['cached_gaussian']))
    if torch.cuda.is_available():
        index = torch.cuda.current_device()
        cuda_state, why = cuda_state_for_this_device(state, index)
        if cuda_state is not None:
            torch.cuda.set_rng_state(cuda_state, index)
        else:
            torch.cuda.manual_seed(reseed or 0)
            notices.append(f'CUDA RNG re-seeded ({why})')
    saved_devices = state.get('generator_devices', {})
    for name, g_state in state.get('generators', {}).items():
        if name not in GENERATORS:
            continue
        g = GENERATORS[name]
        saved_type = saved_devices.get(name)
        try:
            if saved_type not in (None, g.device.type):
                raise RuntimeError(f'saved on {saved_type}')
            g.set_state(g_state)
        except RuntimeError as e:
            g.manual_seed((reseed or 0) % 2 ** 63)
            notices.append(f'the {name} generator re-seeded (its saved state cannot be loaded on '
                           f'{g.device.type}: {str(e).splitlines()[0][:80]})')
    return notices


def rank_rng_state(ckpt, rank, world_size):
    """The RNG state this process resumes from: its own when the checkpoint was written by as many processes (or
    by one process and this is one process), else ``None`` with the reason (every process is then re-seeded: one
    saved state given to several processes would make them draw the same numbers)."""
    ranks = ckpt.get('rng_ranks')
    saved_world = len(ranks) if ranks else 1
    if saved_world == world_size:
        return (ranks[rank] if ranks else ckpt['rng']), None
    return None, f'the checkpoint was written by {saved_world} process(es), this run has {world_size}'
