"""Stage 2: linear evaluation of a frozen stage-1 encoder, or (``--finetune``) fine-tuning of the encoder with the
linear classifier; ``--label_fraction`` trains on a fixed labelled fraction of the training set.

    python main_linear.py --dataset digits --ckpt save/SupCon/digits/<run>/last.pth
    python main_linear.py --ckpt save/SupCon/digits/<run>/last.pth --finetune --label_fraction 0.1

Reads checkpoints of this project (any of the three scripts' encoders) and of
the original SupContrast. Prints the final and the best test top-1; with
``--val_split`` it selects the epoch on the held-out part of the training set (by default the part the stage-1 run
held out), and with ``--eval_split val`` it reads no test image.
"""
import json
import os
import sys

import core.requirements  # noqa: F401  (first: a Python without the requirements gets one line)

import numpy as np
import torch

from config.cli import run_cli
from config.options import parse_option
from config.resume import config_dict
from core.flags import UserError, call_hook
from data import (
    announce_label_fraction,
    build_dataset,
    build_loader,
    build_transform,
    classes_to_classify,
    coarse_labels,
    dataset_info,
    evaluated_parts,
    evaluation_loaders,
    held_out_labels,
    long_tail_class_counts,
    save_label_noise,
)
from engine.run import fit, report_selection, setup, write_results
from evaluation.knn import extract_features, knn_predict
from evaluation.probes import LinearProbe, few_shot_indices, linear_probe, within_superclass_accuracy
from runtime.checkpoint import load_encoder
from runtime.device import Runtime
from runtime.distributed import is_main
from runtime.run_log import read_metrics
from tracking.trackers import finish as finish_trackers
from tracking.trackers import open_for_run as open_trackers
from training.loop import Optimization
from training.monitors import probe_divergence
from training.schedule import Schedule, optimizer_for
from util import progress


def within_superclass(frozen, coarse_of, k, t, part='test'):
    """``docs/PROBES.md``: fine-label kNN top-1 (``k`` neighbours, temperature ``t``) within each image's own
    superclass (``coarse_of[fine]``; all training labels) of ``part`` (the test split, or ``val``, the held-out part).
    ``frozen(part, granularity)``: a part's features."""
    train_feats, train_fine = frozen('train', 'fine')
    test_feats, test_fine = frozen(part, 'fine')
    return within_superclass_accuracy(train_feats, train_fine, test_feats, test_fine, coarse_of, k, t)


def few_shot(frozen, granularity, shots, draws, seed, k, t, part='test'):
    """``--shots K``: per draw (``--shot_draws``, seeded from ``--shot_seed``), a logistic regression and a kNN
    (``k``, ``t``) on K labelled training images per class, evaluated on the whole of ``part`` (the test split, or
    ``val``: the held-out part); results.json holds the mean and std over the draws. ``frozen(part, granularity)``: a
    part's unit features and labels."""
    train_feats, train_y = frozen('train', granularity)
    test_feats, test_y = frozen(part, granularity)
    n_cls = int(torch.cat([train_y, test_y]).max()) + 1
    if len(torch.unique(train_y)) < 2:
        raise UserError('the training split has 1 class: a few-shot probe needs at least 2')
    linear, knn = [], []
    for draw in progress(range(draws), f'{shots}-shot draws'):
        idx = torch.as_tensor(few_shot_indices(train_y.tolist(), shots, seed + draw), device=train_y.device)
        linear.append(linear_probe(train_feats[idx], train_y[idx], test_feats, test_y, n_cls))
        knn.append(100.0 * (knn_predict(train_feats[idx], train_y[idx], test_feats, n_cls, k, t)
                            == test_y).double().mean().item())
    results = {'shots': shots, 'shot_draws': draws, 'shot_seed': seed, 'test_split_read': part == 'test',
               f'final_{part}_acc': float(np.mean(linear)), f'final_{part}_acc_std_over_draws': float(np.std(linear)),
               f'final_{part}_knn_acc': float(np.mean(knn)), f'final_{part}_knn_acc_std_over_draws': float(np.std(knn)),
               f'draws_{part}_acc': linear, f'draws_{part}_knn_acc': knn}
    print(f'{shots}-shot linear probe ({part}): {np.mean(linear):.2f} ± {np.std(linear):.2f} over '
          f'{draws} draws; {shots}-shot kNN: {np.mean(knn):.2f} ± {np.std(knn):.2f}')
    return results


def main(argv=None):
    opt = setup(parse_option('linear', argv))
    runtime = call_hook(Runtime, opt)
    encoder, opt.model = load_encoder(opt.ckpt, opt.model, dataset_info(opt.dataset).model, runtime)

    parts = evaluated_parts(opt.val_split, opt.eval_split)      # the held-out part first: it selects the epoch
    probed = parts[-1]                                          # what the probes measure: test, unless not read

    def frozen(part, granularity):
        """Unit encoder features and labels of a part, with the evaluation transform (no augmentation)."""
        dataset = build_dataset(opt, part, build_transform(opt, 'eval'), granularity)
        return extract_features(runtime, encoder, build_loader(opt, dataset, train=False))

    def superclass_probe():
        acc = within_superclass(frozen, coarse_labels(opt.dataset)[0], opt.knn_k, opt.knn_t, probed)
        print(f'within-superclass fine kNN top-1 ({probed}): {acc:.2f}')
        return acc

    if opt.shots:
        if os.path.isfile(os.path.join(opt.run_folder, 'results.json')):
            raise UserError(f'{opt.run_folder} already holds results.json of this probe: start another with a new '
                            f'--trial or --save_folder (or --shot_seed for other draws)')
        print(f'run folder: {opt.run_folder}')
        if is_main():      # the probe's W&B / MLflow run: its flags, then its results
            call_hook(open_trackers, opt, config=config_dict(opt), resumed=False)
        results = few_shot(frozen, opt.eval_labels, opt.shots, opt.shot_draws, opt.shot_seed, opt.knn_k, opt.knn_t,
                           probed)
        if opt.within_superclass:
            results[f'final_{probed}_within_superclass_acc'] = superclass_probe()
        if is_main():
            path = os.path.join(opt.run_folder, 'results.json')
            held = {'held_out_labels': held_out_labels(opt.held_out_noise)} if opt.val_split else {}
            with open(path, 'w') as f:
                json.dump({**results, **held, 'ckpt': os.path.abspath(opt.ckpt), 'config': config_dict(opt)}, f,
                          indent=2)
            finish_trackers({**results, **held}, path)
        return
    # the classifier's labels: --eval_labels (fine labels for a coarse-trained encoder: coarse-to-fine)
    train_set = build_dataset(opt, 'train', build_transform(opt, 'train'), opt.eval_labels)
    n_cls = classes_to_classify(train_set)
    announce_label_fraction(train_set)
    save_label_noise(opt.run_folder, train_set)
    counts = long_tail_class_counts(opt.dataset, train_set)
    loaders = evaluation_loaders(opt, parts, opt.eval_labels)
    train_loader = build_loader(opt, train_set, train=True, kind='train')

    probe = LinearProbe(opt, encoder, n_cls, loaders, counts)     # classifier (and the encoder with --finetune)
    optim = Optimization(optimizer_for(opt, probe.parameters(), scaled=probe.scaled), probe.runtime.grad_scaler(),
                         call_hook(Schedule, opt))
    print(f'run folder: {opt.run_folder}')
    select = f'{parts[0]}/acc'
    last, best = fit(opt, probe, optim, train_loader, select=select)
    last = last or best
    extra = {'n_train': len(train_set)}
    if opt.within_superclass:
        extra[f'final_{probed}_within_superclass_acc'] = superclass_probe()
    if is_main():           # a probe that did not converge says so, with what was measured
        losses = [float(row['train/loss']) for row in read_metrics(opt.run_folder) if row.get('train/loss')]
        warning = probe_divergence(losses, n_cls, last.get(f'{probed}/nll'))
        extra.update(probe_diverged=warning is not None, probe_warning=warning)
        if warning:
            print(f'warning: {warning}', file=sys.stderr, flush=True)
            with open(os.path.join(opt.run_folder, 'warnings.txt'), 'a') as f:
                f.write(f'after epoch {opt.epochs}: {warning}\n')
    # the figures, then results.json (which finishes the trackers: their lines, where each wrote, come last)
    report_selection(last, best, select, opt.test_every == 'end')
    write_results(opt, last, best, select, ckpt=os.path.abspath(opt.ckpt), **extra)


if __name__ == '__main__':
    run_cli(main)
