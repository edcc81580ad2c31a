"""Stage 1: contrastive pre-training with any method of the registry in ``methods.py`` (SupCon, SimCLR,
RASCAL), optionally with the CARROT regularizer (--carrot). SupCon/SimCLR take NT-Xent (default),
NT-Logistic or Marginal Triplet (--simclr_loss).

    python main_supcon.py --dataset digits --epochs 30 --batch_size 128 --learning_rate 0.2 --temp 0.1 --cosine
    python main_supcon.py --method RASCAL --rascal_weighting agreement ...
"""
import core.requirements  # noqa: F401  (first: a Python without the requirements gets one line)

from config.cli import run_cli
from config.options import parse_option
from core.flags import call_hook
from data import build_dataset, build_loader, class_counts, contrastive_views, save_label_noise
from datasets_indexed import IndexedDataset
from engine.run import fit, setup
from evaluation.knn import knn_monitor
from methods import get_method
from training.loop import Optimization
from training.schedule import Schedule, optimizer_for
from training.steps import Pretraining


def main(argv=None):
    opt = setup(parse_option('supcon', argv))
    train_set = build_dataset(opt, 'train', contrastive_views(opt))     # --n_views (and --num_small_crops) views
    if get_method(opt.method).uses_ids or opt.queue_size:     # the queue stores dataset ids too
        train_set = IndexedDataset(train_set)
    loader = build_loader(opt, train_set, train=True, kind='contrastive', n_views=opt.n_views)   # device: large only
    save_label_noise(opt.run_folder, train_set)
    pre = Pretraining(opt, len(train_set), class_counts=class_counts(train_set),     # model, loss, CARROT, queue, ...
                      monitor=knn_monitor(opt) if opt.knn_every else None)
    optim = Optimization(optimizer_for(opt, pre.parameters(), fused=opt.compile), pre.runtime.grad_scaler(),
                         call_hook(Schedule, opt))
    print(f'run folder: {opt.run_folder}')
    fit(opt, pre, optim, loader)
    print(f'checkpoint: {opt.run_folder}/last.pth')


if __name__ == '__main__':
    run_cli(main)
