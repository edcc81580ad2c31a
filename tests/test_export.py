"""export.py: the encoder alone as safetensors and a plain state_dict with a card; loaded into torchvision's ResNets
(the CIFAR stem replaced as the card says) and into timm, each gives our encoder's features on the same images."""
import json
import os

import pytest
import torch

import export
from helpers import assert_one_line_error, run_in_process, run_script
from networks import SupConResNet


def saved_run(tmp_path, name, epoch=2, epochs=2, **kw):
    """A checkpoint of a SupCon run of ``name`` as main_supcon.py writes it (model, config, epoch)."""
    torch.manual_seed(0)
    model = SupConResNet(name, **kw)
    with torch.no_grad():            # BatchNorm statistics that are not the defaults
        model.train()(torch.randn(4, 3, kw['size'], kw['size']))
    config = {'model': name, 'stem': kw.get('stem'), 'size': kw['size'], 'model_args': kw.get('model_args', ''),
              'dataset': 'digits', 'epochs': epochs, 'script': 'supcon', 'method': 'SupCon'}
    path = tmp_path / f'{name.replace(":", "_")}.pth'
    torch.save({'model': model.state_dict(), 'config': config, 'epoch': epoch}, path)
    return path, model.eval()


@pytest.mark.parametrize('name, stem, size', [('resnet18', 'cifar', 32), ('resnet50', 'imagenet', 64)])
def test_our_resnets_load_into_torchvision(tmp_path, name, stem, size):
    import safetensors.torch
    import torchvision
    path, model = saved_run(tmp_path, name, stem=stem, size=size)
    card = export.export(str(path), str(tmp_path / 'out'))
    assert card['keys'] == 'torchvision' and card['finished'] and card['feature_dim'] == model.dim
    tv = getattr(torchvision.models, name)()
    tv.fc = torch.nn.Identity()
    if stem == 'cifar':               # as the card's "load" says
        assert export.CIFAR_STEM in card['load']
        tv.conv1, tv.maxpool = torch.nn.Conv2d(3, 64, 3, 1, 1, bias=False), torch.nn.Identity()
    tv.load_state_dict(safetensors.torch.load_file(tmp_path / 'out' / 'encoder.safetensors'))   # strict: every key
    x = torch.randn(3, 3, size, size)
    with torch.no_grad():
        torch.testing.assert_close(tv.eval()(x), model.encoder(x), rtol=1e-5, atol=1e-5)
    plain = torch.load(tmp_path / 'out' / 'encoder.pth', weights_only=True)
    assert plain.keys() == safetensors.torch.load_file(tmp_path / 'out' / 'encoder.safetensors').keys()


def test_a_timm_model_loads_into_timm(tmp_path):
    import timm
    args = dict(size=16, model_args='depth=1,patch_size=4')
    path, model = saved_run(tmp_path, 'timm:vit_tiny_patch16_224', **args)
    card = export.export(str(path), str(tmp_path / 'out'))
    assert card['keys'] == 'timm' and 'pretrained_cfg_overlay' in card['load']
    loaded = timm.create_model('vit_tiny_patch16_224', pretrained=True, num_classes=0, img_size=16, depth=1,
                               patch_size=4,
                               pretrained_cfg_overlay=dict(file=str(tmp_path / 'out' / 'encoder.safetensors')))
    scope = {}                                            # the card's line as written, in an empty namespace
    exec(card['load'], scope)
    loaded_by_card = scope['model']
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        torch.testing.assert_close(loaded.eval()(x), model.encoder(x), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(loaded_by_card.eval()(x), model.encoder(x), rtol=1e-5, atol=1e-5)


def test_an_unfinished_run_says_so_and_bad_input_is_one_line(tmp_path):
    path, _ = saved_run(tmp_path, 'resnet18', epoch=1, epochs=5, stem='cifar', size=32)
    out = run_in_process('export.py', '--ckpt', path, '--out', tmp_path / 'out')
    assert out.returncode == 0 and 'not finished (epoch 1 of 5)' in out.stdout
    with open(tmp_path / 'out' / 'card.json') as f:
        card = json.load(f)
    assert card['finished'] is False and card['epochs_trained'] == 1 and card['model'] == 'resnet18'
    assert_one_line_error(run_in_process('export.py', '--ckpt', path, '--out', tmp_path / 'out'),
                          'already holds an export')
    assert_one_line_error(run_in_process('export.py', '--ckpt', tmp_path / 'none.pth', '--out', tmp_path / 'o2'),
                          'not found')
    (tmp_path / 'file').write_text('x')
    assert_one_line_error(run_in_process('export.py', '--ckpt', path, '--out', tmp_path / 'file'), 'is a file')
    torch.save({'model': {'fc.weight': torch.zeros(2, 2)}, 'config': {'model': 'resnet18'}}, tmp_path / 'lin.pth')
    assert_one_line_error(run_in_process('export.py', '--ckpt', tmp_path / 'lin.pth', '--out', tmp_path / 'o3'),
                          'no encoder weights')


@pytest.mark.slow
@pytest.mark.xdist_group('tiny')
def test_export_of_a_real_run(tiny_ckpt, tmp_path):
    """Through the real script, on a run of main_supcon.py (resnet_nano: this repository's keys)."""
    out = run_script('export.py', '--ckpt', tiny_ckpt, '--out', tmp_path / 'out')
    assert 'exported the resnet_nano encoder' in out.stdout
    with open(tmp_path / 'out' / 'card.json') as f:
        card = json.load(f)
    assert card['keys'] == 'this repo' and card['finished'] and card['dataset'] == 'digits' and card['size'] == 8
    assert sorted(os.listdir(tmp_path / 'out')) == ['card.json', 'encoder.pth', 'encoder.safetensors']


def test_the_card_carries_the_figures_of_its_own_epoch(tmp_path):
    """An intermediate checkpoint's card has that epoch and the test accuracy measured then (metrics.csv), never the
    run's final results.json; a pre-training checkpoint has none, and the card says why."""
    path, _ = saved_run(tmp_path, 'resnet18', epoch=1, epochs=2, stem='cifar', size=32)
    (tmp_path / 'metrics.csv').write_text('epoch,test/acc,train/loss\n1,61.5,2.0\n2,97.25,0.5\n')
    (tmp_path / 'results.json').write_text(json.dumps({'final_test_acc': 97.25}))
    assert run_in_process('export.py', '--ckpt', path, '--out', tmp_path / 'e1').returncode == 0
    card = json.loads((tmp_path / 'e1' / 'card.json').read_text())
    assert card['epochs_trained'] == 1 and card['test_acc'] == 61.5 and 'epoch 1' in card['test_acc_note']
    (tmp_path / 'metrics.csv').write_text('epoch,train/loss\n1,2.0\n2,0.5\n')       # a pre-training run's
    assert run_in_process('export.py', '--ckpt', path, '--out', tmp_path / 'e2').returncode == 0
    card = json.loads((tmp_path / 'e2' / 'card.json').read_text())
    assert card['test_acc'] is None and 'no test accuracy was measured at epoch 1' in card['test_acc_note']


def test_exports_are_readable_by_all_and_the_load_line_works_from_anywhere(tmp_path, monkeypatch):
    import stat

    import safetensors.torch  # noqa: F401  (the load line's names)
    import torchvision  # noqa: F401
    path, model = saved_run(tmp_path, 'resnet18', stem='cifar', size=32)
    assert run_in_process('export.py', '--ckpt', path, '--out', tmp_path / 'out').returncode == 0
    modes = {name: stat.S_IMODE(os.stat(tmp_path / 'out' / name).st_mode) for name in os.listdir(tmp_path / 'out')}
    assert set(modes.values()) == {0o644}, modes
    card = json.loads((tmp_path / 'out' / 'card.json').read_text())
    elsewhere = tmp_path / 'elsewhere'
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    scope = {}                                            # the line imports what it uses
    exec(card['load'], scope)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(scope['model'].eval()(x), model.encoder(x), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize('stem, size', [('cifar', 16), ('imagenet', 64)])
def test_the_load_line_of_our_own_resnet_works_as_written(tmp_path, monkeypatch, stem, size):
    """resnet_tiny, which torchvision does not have: the card's load line, run as written from another folder,
    builds it from this repository and loads every weight; its features are ours."""
    import safetensors.torch  # noqa: F401  (the load line's names)
    path, model = saved_run(tmp_path, 'resnet_tiny', stem=stem, size=size)
    assert run_in_process('export.py', '--ckpt', path, '--out', tmp_path / 'out').returncode == 0
    card = json.loads((tmp_path / 'out' / 'card.json').read_text())
    assert card['keys'] == 'this repo'
    elsewhere = tmp_path / 'elsewhere'
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    scope = {}                                            # the line imports what it uses
    exec(card['load'], scope)
    x = torch.randn(2, 3, size, size)
    with torch.no_grad():
        torch.testing.assert_close(scope['model'].eval()(x), model.encoder.eval()(x), rtol=1e-5, atol=1e-5)


def test_a_model_this_timm_cannot_build_and_a_run_folder(tmp_path):
    """A checkpoint naming a timm model (or a model argument) this timm does not have is one line; a run folder
    stands for its last.pth."""
    path, _ = saved_run(tmp_path, 'resnet18', stem='cifar', size=32)
    ckpt = torch.load(path, weights_only=True)
    for name, model, args in (('gone', 'timm:no_such_model_v9', ''), ('arg', 'timm:vit_tiny_patch16_224', 'wings=3')):
        ckpt['config'].update(model=model, model_args=args)
        torch.save(ckpt, tmp_path / f'{name}.pth')
        assert_one_line_error(run_in_process('export.py', '--ckpt', tmp_path / f'{name}.pth', '--out',
                                             tmp_path / f'o_{name}'), 'cannot be built here')
    run = tmp_path / 'run'
    run.mkdir()
    os.replace(path, run / 'last.pth')
    out = run_in_process('export.py', '--ckpt', run, '--out', tmp_path / 'o_run')
    assert out.returncode == 0 and f'--ckpt {run} is a run folder: its last.pth' in out.stdout
    assert_one_line_error(run_in_process('export.py', '--ckpt', tmp_path / 'o_run', '--out', tmp_path / 'o4'),
                          'is a folder without a last.pth')


@pytest.mark.parametrize('layout', ['save folder', 'sweep cell'])
def test_the_card_takes_a_linear_evaluation_of_the_same_checkpoint_beside_it(tmp_path, layout):
    """A pre-training run has no test accuracy of its own; a linear evaluation of that very checkpoint beside it
    (main_linear.py into the same --save_folder, or a sweep cell's evaluation) gives the card's, naming its file. One
    of another checkpoint does not."""
    path, _ = saved_run(tmp_path, 'resnet_tiny', stem='cifar', size=16)
    stage1 = tmp_path / 'cell' / 'pretrain' if layout == 'sweep cell' else tmp_path / 'save'
    run = stage1 / 'SupCon' / 'digits' / 'run'
    run.mkdir(parents=True)
    os.replace(path, run / 'last.pth')
    linear = (tmp_path / 'cell' / 'linear' if layout == 'sweep cell' else tmp_path / 'save') / 'Linear' / 'digits'
    for name, ckpt, acc in (('mine', run / 'last.pth', 97.5), ('other', run / 'ckpt_epoch_1.pth', 12.0)):
        (linear / name).mkdir(parents=True)
        (linear / name / 'results.json').write_text(json.dumps({'final_test_acc': acc, 'ckpt': str(ckpt)}))
    assert run_in_process('export.py', '--ckpt', run / 'last.pth', '--out', tmp_path / 'out').returncode == 0
    card = json.loads((tmp_path / 'out' / 'card.json').read_text())
    assert card['test_acc'] == 97.5 and str(linear / 'mine' / 'results.json') in card['test_acc_note']


def test_the_card_takes_only_a_frozen_linear_probe_that_finished_and_says_which(tmp_path):
    """Beside the run: a frozen probe (84.17), a fine-tuning of the same checkpoint (81.39, newer), a diverged
    fine-tuning (10.0, newest), a diverged frozen probe and a 10-shot probe, as main_linear.py writes their
    results.json. The card takes the frozen probe; with a second frozen probe, the newest of the two, and the note
    says there were two."""
    path, _ = saved_run(tmp_path, 'resnet_tiny', stem='cifar', size=16)
    run = tmp_path / 'save' / 'SupCon' / 'digits' / 'run'
    run.mkdir(parents=True)
    os.replace(path, run / 'last.pth')
    linear = tmp_path / 'save' / 'Linear' / 'digits'
    ckpt = str(run / 'last.pth')
    results = [('frozen', {'final_test_acc': 84.17, 'probe_diverged': False, 'config': {'finetune': False}}),
               ('finetune', {'final_test_acc': 81.39, 'probe_diverged': False, 'config': {'finetune': True}}),
               ('finetune_lr1', {'final_test_acc': 10.0, 'probe_diverged': True, 'config': {'finetune': True}}),
               ('diverged', {'final_test_acc': 9.8, 'probe_diverged': True, 'config': {'finetune': False}}),
               ('shots', {'final_test_acc': 70.0, 'shots': 10, 'config': {'shots': 10}})]
    for i, (name, result) in enumerate(results):
        (linear / name).mkdir(parents=True)
        result['ckpt'] = ckpt
        (linear / name / 'results.json').write_text(json.dumps(result))
        os.utime(linear / name / 'results.json', (1000 + i, 1000 + i))
    assert run_in_process('export.py', '--ckpt', ckpt, '--out', tmp_path / 'out').returncode == 0
    card = json.loads((tmp_path / 'out' / 'card.json').read_text())
    assert card['test_acc'] == 84.17 and str(linear / 'frozen' / 'results.json') in card['test_acc_note']
    assert 'newest' not in card['test_acc_note']
    (linear / 'again').mkdir()
    (linear / 'again' / 'results.json').write_text(json.dumps({**results[0][1], 'final_test_acc': 85.0}))
    assert run_in_process('export.py', '--ckpt', ckpt, '--out', tmp_path / 'out2').returncode == 0
    card = json.loads((tmp_path / 'out2' / 'card.json').read_text())
    assert card['test_acc'] == 85.0 and 'the newest of the 2 frozen linear probes' in card['test_acc_note']
