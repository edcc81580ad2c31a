"""Stage 1: contrastive pre-training with any method of the registry in ``methods.py`` (SupCon, SimCLR,
RASCAL), optionally with the CARROT regularizer (--carrot). SupCon/SimCLR take NT-Xent (default),
NT-Logistic or Marginal Triplet (--simclr_loss).

    python main_supcon.py --dataset digits --epochs 30 --batch_size 128 --learning_rate 0.2 --temp 0.1 --cosine
    python main_supcon.py --method RASCAL --rascal_weighting agreement ...
"""
from collections import defaultdict

from data import TwoCropTransform, build_dataset, build_loader, build_transform, save_label_noise
from datasets_indexed import IndexedDataset
from distributed import wrap_model
from engine import fit, setup, train_loop
from knn import knn_monitor
from losses_carrot import CARROT
from memory_queue import MemoryQueue, MomentumEncoder
from methods import get_method
from networks import SupConResNet
from options import parse_option
from steps import contrastive_step
from util import grad_scaler, prepare_model, run_cli, set_optimizer


def main(argv=None):
    opt = setup(parse_option('supcon', argv))
    method = get_method(opt.method)
    train_set = build_dataset(opt, True, TwoCropTransform(build_transform(opt, 'contrastive')))
    if method.uses_ids or opt.queue_size:     # the queue stores dataset ids too
        train_set = IndexedDataset(train_set)
    loader = build_loader(opt, train_set, train=True, kind='contrastive', n_views=2)
    save_label_noise(opt, train_set)
    model = prepare_model(opt, SupConResNet(opt.model, head=opt.head, feat_dim=opt.feat_dim))
    ddp_model = wrap_model(opt, model)    # the model itself in one process
    criterion = method.build(opt, len(train_set)).to(opt.device)
    optimizer = set_optimizer(opt, model.parameters())
    scaler = grad_scaler(opt)
    carrot = CARROT(opt.carrot_q_hi, opt.carrot_q_lo) if opt.carrot else None
    # docs/QUEUE.md: the memory queue and the momentum key encoder (a copy of the model as it starts)
    queue = MemoryQueue(opt.queue_size, opt.feat_dim).to(opt.device) if opt.queue_size else None
    key_encoder = MomentumEncoder(model, opt.moco_m) if opt.queue_size and opt.moco_m > 0 else None
    hists = defaultdict(lambda: 0)     # the loss's histogram counts, summed over the epoch

    def step(batch, backward):
        loss, stats = contrastive_step(opt, method, ddp_model, model, criterion, carrot, *batch, backward=backward,
                                       queue=queue, key_encoder=key_encoder)
        for name, counts in criterion.last_hists.items():
            hists[name] = hists[name] + counts
        return loss, batch[1].shape[0], stats

    def train_epoch(epoch):
        ddp_model.train()
        hists.clear()
        metrics = train_loop(opt, loader, optimizer, scaler, epoch, step, opt.method)
        metrics.update({f'hist/{method.stats_prefix}{name}': counts.cpu().clone() for name, counts in hists.items()})
        return metrics

    # the loss's own state (RASCAL's cache, ...), the queue and the key encoder travel in checkpoints
    extra = {name: obj for name, obj in (('criterion', criterion), ('queue', queue), ('key_encoder', key_encoder))
             if obj is not None and obj.state_dict()}
    print(f'run folder: {opt.run_folder}')
    fit(opt, model, optimizer, train_epoch, knn_monitor(opt, model) if opt.knn_every else None, extra=extra)
    print(f'checkpoint: {opt.run_folder}/last.pth')


if __name__ == '__main__':
    run_cli(main)
