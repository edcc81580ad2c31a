"""runtime/rng.py: the RNG state round trip, the CUDA state of this device, re-seeding what cannot be restored."""
import random

import numpy as np
import torch

from runtime import rng
from runtime.rng import get_rng_state, set_rng_state


def test_rng_state_round_trip():
    state = get_rng_state()
    a = (random.random(), np.random.rand(), torch.rand(1).item())
    set_rng_state(state)
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == a


def test_cuda_state_of_this_device_only():
    """A checkpoint from a node with more visible GPUs (an old list of every device's state) resumes on one
    device: that device's entry, else ``None`` with the reason (the caller re-seeds), never an IndexError."""
    from runtime.rng import cuda_state_for_this_device
    states = [torch.full((16,), i, dtype=torch.uint8) for i in range(8)]
    state, why = cuda_state_for_this_device({'cuda': states}, 3)
    assert torch.equal(state, states[3]) and why is None
    state, why = cuda_state_for_this_device({'cuda': states[:2]}, 5)
    assert state is None and 'cuda:5' in why
    state, why = cuda_state_for_this_device({'cuda': states[2]}, 0)        # this project's: one device's
    assert torch.equal(state, states[2])
    assert cuda_state_for_this_device({}, 0)[0] is None


def test_generator_saved_on_another_device_is_reseeded_with_a_notice():
    """The augmentation generator of a run resumed on another device type (a CUDA generator's 16-byte state on a
    CPU generator, or the reverse) is re-seeded, and the notice says so."""
    g = rng.register_generator('test_other_device', torch.Generator().manual_seed(1))
    try:
        state = get_rng_state()
        state['generators']['test_other_device'] = torch.zeros(16, dtype=torch.uint8)   # a CUDA generator's
        notices = set_rng_state(state, reseed=42)
        assert len(notices) == 1 and 'test_other_device' in notices[0]
        assert torch.equal(g.get_state(), torch.Generator().manual_seed(42).get_state())
        state['generator_devices'] = {'test_other_device': 'cuda'}
        state['generators']['test_other_device'] = torch.Generator().manual_seed(5).get_state()
        assert len(set_rng_state(state, reseed=7)) == 1                 # refused by the recorded device type
        state['generator_devices'] = {'test_other_device': 'cpu'}
        assert set_rng_state(state, reseed=7) == []                     # power: a matching state is restored
        assert torch.equal(g.get_state(), torch.Generator().manual_seed(5).get_state())
    finally:
        rng.GENERATORS.pop('test_other_device')


def test_rank_states_for_another_number_of_processes():
    """2 -> 3 processes: no process may take rank 0's state (they would all draw alike): every one re-seeds."""
    from runtime.rng import rank_rng_state
    ckpt = {'rng': 'r0', 'rng_ranks': ['r0', 'r1']}
    assert rank_rng_state(ckpt, 1, 2) == ('r1', None)
    for rank in range(3):
        state, why = rank_rng_state(ckpt, rank, 3)
        assert state is None and '2 process(es)' in why and 'has 3' in why
    assert rank_rng_state({'rng': 'r0'}, 0, 1) == ('r0', None)
    assert rank_rng_state({'rng': 'r0'}, 1, 2)[0] is None
