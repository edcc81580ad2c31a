"""Cross-entropy baseline (an encoder and a linear layer trained end to end), optionally logit-adjusted or balanced
softmax for a long tail (--loss) and with CARROT on the penultimate features (--carrot). Reports test accuracy, NLL
and ECE (of the plain logits); with ``--val_split`` the epoch is selected on the held-out part, and with
``--eval_split val`` the test split is not read.

    python main_ce.py --dataset digits --epochs 30 --batch_size 128 --learning_rate 0.1 --cosine
"""
import core.requirements  # noqa: F401  (first: a Python without the requirements gets one line)

from config.cli import run_cli
from config.options import parse_option
from core.flags import call_hook
from data import (
    TwoCropTransform,
    announce_label_fraction,
    build_dataset,
    build_loader,
    build_transform,
    class_counts,
    classes_to_classify,
    evaluated_parts,
    evaluation_loaders,
    long_tail_class_counts,
    save_label_noise,
)
from engine.run import fit, report_selection, setup, write_results
from training.loop import Optimization
from training.schedule import Schedule, optimizer_for
from training.steps import CETraining


def main(argv=None):
    opt = setup(parse_option('ce', argv))
    # one-stage SupCon (--supcon_weight) trains on two views with SupCon's augmentation, CE on both
    two_views = opt.supcon_weight > 0
    transform = TwoCropTransform(build_transform(opt, 'contrastive')) if two_views else build_transform(opt, 'train')
    train_set = build_dataset(opt, 'train', transform)
    train_loader = build_loader(opt, train_set, train=True, kind='contrastive' if two_views else 'train',
                                n_views=2 if two_views else None)
    announce_label_fraction(train_set)
    save_label_noise(opt.run_folder, train_set)
    counts = long_tail_class_counts(opt.dataset, train_set)
    n_cls = classes_to_classify(train_set)
    parts = evaluated_parts(opt.val_split, opt.eval_split)      # the held-out part first: it selects the epoch
    ce = CETraining(opt, n_cls, class_counts(train_set), eval_loaders=evaluation_loaders(opt, parts),
                    eval_counts=counts)       # model, loss and CARROT; evaluated after every epoch
    optim = Optimization(optimizer_for(opt, ce.model.parameters(), fused=opt.compile), ce.runtime.grad_scaler(),
                         call_hook(Schedule, opt))
    print(f'run folder: {opt.run_folder}')
    select = f'{parts[0]}/acc'
    last, best = fit(opt, ce, optim, train_loader, select=select)
    last = last or best
    # the figures, then results.json (which finishes the trackers: their lines, where each wrote, come last)
    report_selection(last, best, select, opt.test_every == 'end')
    write_results(opt, last, best, select, n_train=len(train_set))


if __name__ == '__main__':
    run_cli(main)
