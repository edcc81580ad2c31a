"""The pre-trained encoder alone, in the formats other tools load: no projection head, no classifier, no optimizer.

    python export.py --ckpt save/SupCon/cifar10/<run>/last.pth --out exported/

writes into ``--out``:

- ``encoder.safetensors`` and ``encoder.pth`` (a plain ``state_dict``): the encoder's weights. For our ResNets the
  keys are torchvision's (``torchvision.models.resnet18/34/50/101``: our ``shortcut`` is its ``downsample``); a run
  with the CIFAR stem (a 3x3 convolution of stride 1, no max-pool) loads after the model's stem is replaced the same
  way (``card.json``'s ``load`` says how). For ``timm:<name>`` the keys are timm's, for
  ``timm.create_model(name, pretrained=True, pretrained_cfg_overlay=dict(file=...), num_classes=0, ...)``.
- ``card.json``: the model, stem, image size, normalization, method, dataset, epochs trained (and whether the run
  had finished), the test accuracy measured at the checkpoint's own epoch (a CE run's; none for a pre-training run,
  whose probe is main_linear.py's, and the card says so), the commit, and how to load it (a line that works from any
  folder: the weights' absolute path).

A run that is not finished is exported with a line and ``"finished": false`` in the card; bad input is one line.
"""
import glob
import json
import os
import subprocess

import core.requirements  # noqa: F401  (first: a Python without the requirements gets one line)

import torch

from config.cli import run_cli
from core.flags import Parser, UserError
from data import DATASETS, mean_std
from networks import MODELS, parse_model_args
from runtime.checkpoint import current_umask, load_checkpoint, run_checkpoint, saved_encoder
from runtime.run_folder import writable_folder
from runtime.run_log import read_metrics

ROOT = os.path.dirname(os.path.abspath(__file__))       # this repository (its networks/ for our other models)
TORCHVISION = {'resnet18', 'resnet34', 'resnet50', 'resnet101'}     # our ResNets torchvision has by that name
CIFAR_STEM = 'model.conv1 = torch.nn.Conv2d(3, 64, 3, 1, 1, bias=False); model.maxpool = torch.nn.Identity()'


def torchvision_keys(state):
    """Our ResNet's keys as torchvision names them (``shortcut`` is ``downsample``)."""
    return {k.replace('.shortcut.', '.downsample.'): v.contiguous() for k, v in state.items()}


def load_instructions(model, stem, img_size, model_args, file):
    """How to load the exported weights, as one line of Python (the card's ``load``) that imports what it uses: pasted
    into a fresh interpreter it leaves the encoder in ``model``."""
    if model.startswith('timm:'):
        extra = ''.join(f', {k}={v!r}' for k, v in parse_model_args(model_args).items())
        size_arg = f', img_size={img_size}' if img_size else ''
        return (f'import timm; model = timm.create_model({model[len("timm:"):]!r}, pretrained=True, '
                f'pretrained_cfg_overlay=dict(file={file!r}), num_classes=0{size_arg}{extra})')
    if model in TORCHVISION:
        steps = (f'import torch, torchvision, safetensors.torch; model = torchvision.models.{model}(); '
                 f'model.fc = torch.nn.Identity(); ')
        if stem == 'cifar':
            steps += CIFAR_STEM + '; '
        return steps + f'model.load_state_dict(safetensors.torch.load_file({file!r}))'
    return (f'import sys; sys.path.insert(0, {ROOT!r}); import networks, safetensors.torch; '
            f'model, _ = networks.build_encoder({model!r}, stem={stem!r}); '
            f'model.load_state_dict(safetensors.torch.load_file({file!r}))')


def commit():
    try:
        out = subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], cwd=ROOT,
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip() or None
    except (OSError, subprocess.TimeoutExpired):
        return None


def measured_at(run_folder, epoch):
    """``{'test_acc': ..., 'knn_acc': ...}``: what the run measured at ``epoch`` (its ``metrics.csv`` row: a CE or
    linear run's test accuracy, a pre-training run's kNN monitor), the keys it measured only; ``{}`` when nothing
    was measured then (a pre-training run without ``--knn_every``, an epoch between kNN evaluations)."""
    row = next((r for r in read_metrics(run_folder) if r.get('epoch') == str(epoch)), {})
    names = {'test_acc': 'test/acc', 'knn_acc': 'knn/acc'}
    return {key: float(row[column]) for key, column in names.items() if row.get(column)}


def frozen_probe(result):
    """Whether a main_linear.py ``results.json`` is a finished linear probe of a frozen encoder that converged: not a
    fine-tuning (another encoder), not a few-shot probe, not one that diverged."""
    config = result.get('config') or {}
    return not (config.get('finetune') or result.get('shots') or config.get('shots') or result.get('probe_diverged'))


def linear_beside(ckpt_path):
    """``(results.json path, its final test top-1, how many such results there were)`` of a frozen linear probe
    (:func:`frozen_probe`) of exactly ``ckpt_path`` beside its run: main_linear.py's results under the same save folder
    (``<save>/Linear/<dataset>/<run>/``) or, in a sweep's cell, under the cell (``<cell>/<evaluation>/Linear/...``);
    the newest when several; ``(None, None, 0)`` when none."""
    run = os.path.dirname(os.path.abspath(ckpt_path))
    save = os.path.dirname(os.path.dirname(os.path.dirname(run)))
    paths = {os.path.realpath(p): p for pattern in (
        os.path.join(save, 'Linear', '*', '*', 'results.json'),
        os.path.join(os.path.dirname(save), '*', 'Linear', '*', '*', 'results.json')) for p in glob.glob(pattern)}
    found = []
    for path in paths.values():            # each file once (a save folder's results match both patterns)
        try:
            with open(path) as f:
                result = json.load(f)
            read = result.get('ckpt') or (result.get('config') or {}).get('ckpt')
        except (OSError, ValueError, AttributeError):
            continue
        if (read and os.path.realpath(read) == os.path.realpath(ckpt_path) and 'final_test_acc' in result
                and frozen_probe(result)):
            found.append((os.path.getmtime(path), path, result['final_test_acc']))
    return (*max(found)[1:], len(found)) if found else (None, None, 0)


def accuracy_note(epochs_done, measured, linear, n_linear):
    """The card's ``test_acc_note``: where its ``test_acc`` comes from."""
    if 'test_acc' in measured:
        return f'the test accuracy at epoch {epochs_done}, the checkpoint\'s'
    if linear:
        several = (f' (the newest of the {n_linear} frozen linear probes of this checkpoint beside it)'
                   if n_linear > 1 else '')
        return (f'the frozen linear probe of this checkpoint: {linear}{several}; fine-tuning, few-shot and diverged '
                'probes are not counted')
    return (f'no test accuracy was measured at epoch {epochs_done} (a pre-training run has none: main_linear.py '
            'measures one; fine-tuning, few-shot and diverged probes are not counted)')


def export(ckpt_path, out):
    """Write the encoder of ``ckpt_path`` into the folder ``out``; returns the card."""
    from safetensors.torch import save_file
    ckpt_path = run_checkpoint(ckpt_path, '--ckpt')
    ckpt = load_checkpoint(ckpt_path, '--ckpt')
    config = ckpt['config']
    model = config.get('model')
    if not model or not (model in MODELS or model.startswith('timm:')):
        raise UserError(f'{ckpt_path} does not say which encoder it holds (its configuration has no model): '
                        'export checkpoints of this project')
    stem, size, model_args = config.get('stem') or 'cifar', config.get('size') or 32, config.get('model_args') or ''
    encoder, dim, state = saved_encoder(ckpt, model, ckpt_path)
    if model in TORCHVISION:
        state = torchvision_keys(state)
    state = {k: v.detach().contiguous() for k, v in state.items()}
    if os.path.exists(out) and not os.path.isdir(out):
        raise UserError(f'--out {out} is a file: give a folder')
    if os.path.isfile(os.path.join(out, 'card.json')):
        raise UserError(f'{out} already holds an export (card.json): choose another --out')
    writable_folder(out, '--out')
    weights = os.path.abspath(os.path.join(out, 'encoder.safetensors'))
    save_file(state, weights)
    os.chmod(weights, 0o666 & ~current_umask())       # safetensors writes 0600: the mode of any other file instead
    torch.save(state, os.path.join(out, 'encoder.pth'))
    epochs_done, epochs = int(ckpt.get('epoch', 0)), config.get('epochs')
    dataset = config.get('dataset')
    mean, std = mean_std(dataset, config.get('mean'), config.get('std')) if dataset in DATASETS else (
        config.get('mean'), config.get('std'))
    measured = measured_at(os.path.dirname(os.path.abspath(ckpt_path)), epochs_done)
    linear, linear_acc, n_linear = (None, None, 0) if 'test_acc' in measured else linear_beside(ckpt_path)
    card = {'model': model, 'stem': None if model.startswith('timm:') else stem, 'size': size,
            'model_args': model_args, 'feature_dim': dim, 'mean': list(mean) if mean else None,
            'std': list(std) if std else None, 'method': config.get('method') or (
                'CE' if config.get('script') == 'ce' else None), 'script': config.get('script'),
            'dataset': dataset, 'epochs_trained': epochs_done, 'epochs': epochs,
            'finished': epochs is None or epochs_done >= epochs,
            'test_acc': measured.get('test_acc', linear_acc),
            'test_acc_note': accuracy_note(epochs_done, measured, linear, n_linear),
            **({'knn_acc': measured['knn_acc']} if 'knn_acc' in measured else {}),
            'checkpoint': os.path.abspath(ckpt_path), 'commit': commit(),
            'keys': 'torchvision' if model in TORCHVISION else 'timm' if model.startswith('timm:') else 'this repo',
            'load': load_instructions(model, stem, getattr(encoder, 'built_img_size', None), model_args, weights)}
    with open(os.path.join(out, 'card.json'), 'w') as f:
        json.dump(card, f, indent=2)
    return card


def main(argv=None):
    p = Parser(description=__doc__.splitlines()[0])
    p.add_argument('--ckpt', required=True, help='a checkpoint of main_supcon.py or main_ce.py (e.g. <run>/last.pth)')
    p.add_argument('--out', required=True, help='the folder to write encoder.safetensors, encoder.pth, card.json into')
    args = p.parse_args(argv)
    card = export(args.ckpt, args.out)
    if not card['finished']:
        print(f'note: the run is not finished (epoch {card["epochs_trained"]} of {card["epochs"]}): the card says so')
    print(f'exported the {card["model"]} encoder ({card["feature_dim"]} features, {card["keys"]} keys) to '
          f'{args.out}: encoder.safetensors, encoder.pth, card.json')


if __name__ == '__main__':
    run_cli(main)
