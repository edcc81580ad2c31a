"""methods.py: the registry of contrastive methods. A toy method registered from outside the repository's
files trains through the real main_supcon.py, so docs/DEVELOPING.md's "Adding a method" stays true."""
import os
import sys

import pytest

from config.options import parse_option
from core.flags import UserError
from helpers import FAST, load, only_run_folder, read_metrics, run_script
from methods import METHODS, Method, register

TOY = '''
import torch
import torch.nn.functional as F

from losses import Loss, flatten_views
from methods import Method, register


class ToyLoss(Loss):
    """Pulls the views of each sample together: mean over samples of 1 - cos(view 0, view 1), times a weight."""

    def __init__(self, weight):
        super().__init__()
        self.weight = weight
        self.register_buffer('calls', torch.zeros((), dtype=torch.long))

    def forward(self, features, labels=None):
        rows, bsz, n_views = flatten_views(features)
        z = F.normalize(rows, dim=1).reshape(n_views, bsz, -1)
        agreement = (z[0] * z[1]).sum(-1).mean()
        self.calls += 1
        self.last_stats = {'agreement': agreement.detach()}
        return self.weight * (1 - agreement)


register(Method('Toy', build=lambda toy_weight: ToyLoss(toy_weight), uses_labels=False,
                flags={'--toy_weight': dict(type=float, default=0.5, help='weight of the toy loss')},
                stats_prefix='toy/'))
'''


@pytest.mark.slow
def test_a_registered_method_trains_through_the_real_script(tmp_path):
    (tmp_path / 'toy_method.py').write_text(TOY)
    # the plug-in registers on import, then main_supcon.py runs as a script (not imported)
    (tmp_path / 'with_toy.py').write_text(
        'import os, runpy, sys\n'
        'sys.path.insert(1, os.getcwd())             # the repository (the working folder)\n'
        'import toy_method  # noqa: F401            (beside this file)\n'
        'sys.argv = ["main_supcon.py"] + sys.argv[1:]\n'
        'runpy.run_path("main_supcon.py", run_name="__main__")\n')
    args = ['--method', 'Toy', '--toy_weight', '2', '--epochs', '1', '--save_folder', str(tmp_path / 'runs'),
            *map(str, FAST)]
    proc = run_script(tmp_path / 'with_toy.py', *args, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = only_run_folder(tmp_path / 'runs')
    assert os.path.basename(run).startswith('Toy_digits_resnet_nano')
    row = read_metrics(run)[0]
    assert 0 < float(row['train/loss']) <= 4 and -1 <= float(row['train/toy/agreement']) <= 1
    ckpt = load(os.path.join(run, 'last.pth'))
    assert int(ckpt['extra']['criterion']['calls']) == 12      # its state travels in checkpoints: 1437 / 128
    assert ckpt['config']['toy_weight'] == 2.0
    # a flag of another method is refused
    bad = run_script(tmp_path / 'with_toy.py', '--method', 'SupCon', '--toy_weight', '1', check=False)
    assert bad.returncode == 2 and '--toy_weight needs --method Toy' in bad.stderr


def test_every_method_is_registered_and_flags_belong_to_their_methods():
    assert {'SupCon', 'SimCLR', 'RASCAL'} <= set(METHODS)
    assert parse_option('supcon', ['--method', 'RASCAL']).rascal_weighting == 'agreement'
    assert parse_option('supcon', ['--method', 'SupCon']).rascal_weighting is None
    with pytest.raises(UserError, match='--rascal_weighting needs --method RASCAL'):
        parse_option('supcon', ['--method', 'SimCLR', '--rascal_weighting', 'current'])
    with pytest.raises(UserError, match='--simclr_loss needs --method SupCon or SimCLR'):
        parse_option('supcon', ['--method', 'RASCAL', '--simclr_loss', 'ntxent'])


def test_register_refuses_duplicates_and_conflicting_flags():
    with pytest.raises(ValueError, match='registered already'):
        register(Method('SupCon', build=None))
    with pytest.raises(ValueError, match='differs'):
        register(Method('Other', build=None, flags={'--rascal_weighting': dict(type=int)}))
    assert 'Other' not in METHODS


TOY_WITH_LABELS = '''
import torch.nn.functional as F

from losses import Loss, SupConLoss
from methods import Method, register


class ToySupConLoss(Loss):
    """SupCon scaled by a weight, or by its square (--toy_mode square): a labelled toy with a flag of choices."""

    def __init__(self, weight, mode, temp):
        super().__init__()
        self.supcon, self.factor = SupConLoss(temperature=temp), weight if mode == 'plain' else weight ** 2

    def forward(self, features, labels=None, queue=None):
        loss = self.supcon(features, labels, queue=queue)
        self.last_stats = {'factor': loss.new_tensor(self.factor)}
        return self.factor * loss


register(Method('ToySupCon', build=lambda toy_weight, toy_mode, temp: ToySupConLoss(toy_weight, toy_mode, temp),
                takes_queue=True, stats_prefix='toy/',
                flags={'--toy_weight': dict(type=float, default=0.5, help='weight of the toy loss'),
                       '--toy_mode': dict(choices=['plain', 'square'], default='plain', help='how the weight acts')}))
'''


@pytest.fixture
def toy_registered(tmp_path, monkeypatch):
    """The labelled toy method registered in this process, as a plug-in would be, and removed after the test."""
    (tmp_path / 'toy_supcon.py').write_text(TOY_WITH_LABELS)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, 'toy_supcon', raising=False)
    before = dict(METHODS)
    __import__('toy_supcon')
    yield
    METHODS.clear()
    METHODS.update(before)


def test_a_registered_method_is_in_the_sync_step_and_flag_tests_without_editing_them(toy_registered, monkeypatch):
    """Registering a method is all it takes for the suite to cover it: the per-method tests take their modes from
    the registry (helpers.method_modes, helpers.method_flag_needs), so the toy is among the modes of the sync test
    (no host wait in a step), the step tests (gradient caching equals the plain step) and the flag walk; each of those
    tests, run on the toy's modes, passes."""
    import test_steps
    import test_sync

    import sync_count
    from helpers import method_flag_needs, method_modes
    modes = {name: argv for name, argv in method_modes().items() if 'ToySupCon' in argv}
    assert set(modes) == {'ToySupCon', 'ToySupCon + queue + CARROT', 'ToySupCon --toy_mode=square'}
    assert method_flag_needs()['--toy_mode'] == ['--method', 'ToySupCon']
    for name, argv in modes.items():
        monkeypatch.setitem(test_sync.MODES, name, argv)
        with sync_count.accelerator_forms():        # the sync test's fixture
            test_sync.test_pretraining_step_never_waits_for_the_device(name, None)
        steps_argv = method_modes(queue=('--queue_size', '64', '--moco_m', '0'),
                                  carrot=('--carrot', '--carrot_alpha_max', 'inf'))[name]
        monkeypatch.setitem(test_steps.CASES, name, steps_argv)
        test_steps.test_chunked_step_equals_the_plain_step(name, 5)
    opt = parse_option('supcon', ['--method', 'ToySupCon', '--toy_mode', 'square'])
    assert opt.toy_weight == 0.5 and opt.toy_mode == 'square'
