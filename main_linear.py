"""Stage 2: linear evaluation of a frozen stage-1 encoder.

    python main_linear.py --dataset digits --ckpt save/SupCon/digits/<run>/last.pth

Reads checkpoints of this project (any of the three scripts' encoders) and of
the original SupContrast. Prints the final and the best test top-1; with
``--val_split`` it also selects the epoch on held-out training data.
"""
import os

import torch
import torch.nn as nn

from checkpoint import load_encoder
from data import (build_dataset, build_loader, build_transform, dataset_info, long_tail_class_counts, num_classes,
                  split_train_val)
from distributed import wrap_model
from engine import evaluate, fit, setup, train_loop, write_results
from networks import LinearClassifier
from options import parse_option
from util import accuracy, autocast, grad_scaler, run_cli, set_optimizer, to_device


def main(argv=None):
    opt = setup(parse_option('linear', argv))
    encoder = load_encoder(opt, dataset_info(opt.dataset).model)
    # the classifier's labels: --eval_labels (fine labels for a coarse-trained encoder: coarse-to-fine)
    train_set = build_dataset(opt, True, build_transform(opt, 'train'), opt.eval_labels)
    test_set = build_dataset(opt, False, build_transform(opt, 'eval'), opt.eval_labels)
    n_cls = num_classes(train_set)
    counts = long_tail_class_counts(opt, train_set)
    loaders = {}
    if opt.val_split > 0:
        held_out = build_dataset(opt, True, build_transform(opt, 'eval'), opt.eval_labels)
        train_idx, val_idx = split_train_val(train_set.targets, opt.val_split, opt.seed)
        train_set = torch.utils.data.Subset(train_set, train_idx)
        loaders['val'] = build_loader(opt, torch.utils.data.Subset(held_out, val_idx), train=False)
    loaders['test'] = build_loader(opt, test_set, train=False)
    train_loader = build_loader(opt, train_set, train=True, kind='train')

    classifier = LinearClassifier(opt.model, num_classes=n_cls).to(opt.device)
    ddp_classifier = wrap_model(opt, classifier)    # the classifier itself in one process
    criterion = nn.CrossEntropyLoss()
    optimizer = set_optimizer(opt, classifier.parameters())
    scaler = grad_scaler(opt)

    def predict(images, head=classifier):
        with torch.no_grad():
            features = encoder(images)
        return head(features.float())

    def step(batch, backward):
        images, labels = to_device(opt, batch[0]), batch[1].to(opt.device)
        with autocast(opt):
            logits = predict(images, ddp_classifier)
        loss = criterion(logits.float(), labels)
        backward(loss)
        return loss.detach(), labels.shape[0], {'acc': accuracy(logits, labels)[0]}

    def train_epoch(epoch):
        classifier.train()
        return train_loop(opt, train_loader, optimizer, scaler, epoch, step, 'Linear')

    def evaluate_epoch(epoch):
        classifier.eval()
        out = {}
        for split, loader in loaders.items():
            out.update(evaluate(opt, loader, predict, split, n_cls, counts))
        return out

    print(f'run folder: {opt.run_folder}')
    select = 'val/acc' if opt.val_split > 0 else 'test/acc'
    last, best = fit(opt, classifier, optimizer, train_epoch, evaluate_epoch, select=select)
    last = last or best
    write_results(opt, last, best, select, ckpt=os.path.abspath(opt.ckpt))
    if opt.val_split > 0:
        print(f'best val top-1: {best["val/acc"]:.2f} (epoch {best["epoch"]}), '
              f'test top-1 there: {best["test/acc"]:.2f}')
    else:
        print(f'best test top-1: {best["test/acc"]:.2f} (epoch {best["epoch"]})')
    print(f'final test NLL: {last["test/nll"]:.4f}, ECE (15 bins): {last["test/ece"]:.4f}')
    print(f'final test top-1: {last["test/acc"]:.2f}')


if __name__ == '__main__':
    run_cli(main)
