"""Stage 1: contrastive pre-training: SupCon, SimCLR, or RASCAL (rank-agreement weighted SupCon),
optionally with the CARROT regularizer (--carrot). SupCon/SimCLR take NT-Xent (default),
NT-Logistic or Marginal Triplet (--simclr_loss).

    python main_supcon.py --dataset digits --epochs 30 --batch_size 128 --learning_rate 0.2 --temp 0.1 --cosine
    python main_supcon.py --method RASCAL --rascal_weighting agreement ...
"""
import torch
import torch.nn.functional as F

from data import TwoCropTransform, build_dataset, build_loader, build_transform, coarse_labels, num_classes
from datasets_indexed import IndexedDataset
from distributed import gather, gather_with_grad, wrap_model
from engine import carrot_term, fit, prepare_model, train_loop
from knn import extract_features, knn_predict
from losses import MarginalTripletLoss, NTLogisticLoss, SupConLoss
from losses_carrot import CARROT
from losses_rascal import DRIFT_BINS, RASCALLoss
from networks import SupConResNet
from options import parse_option
from util import autocast, grad_scaler, run_cli, set_optimizer, set_seed, to_device


def build_criterion(opt, train_set):
    if opt.method == 'RASCAL':
        # the cache is sized by the dataset and the head; it travels in checkpoints
        return RASCALLoss(len(train_set), opt.feat_dim, temperature=opt.temp, base_temperature=opt.temp,
                          weighting=opt.rascal_weighting, persistent_cache=True).to(opt.device)
    if opt.simclr_loss == 'ntlogistic':
        return NTLogisticLoss(temperature=opt.temp)
    if opt.simclr_loss == 'margin_triplet':
        return MarginalTripletLoss(margin=opt.margin)
    return SupConLoss(temperature=opt.temp)


def contrastive_loss(opt, ddp_model, model, criterion, carrot, views, labels, sample_idx=None):
    """One step's loss and statistics on a batch of ``views`` (a list of ``[b, C, H, W]``).

    ``ddp_model`` is what the forward goes through (DDP under torchrun), ``model`` the module
    itself. Under torchrun the loss sees the global batch (samples in rank order).
    """
    labels = labels.to(opt.device)
    bsz, n_views = labels.shape[0], len(views)
    images = to_device(opt, torch.cat(views, dim=0))            # view-major rows: v * bsz + b
    with autocast(opt):
        h_enc, h_proj = ddp_model(images, parts=True)
    features = F.normalize(h_proj, dim=1)
    features = torch.stack(torch.split(features, bsz, dim=0), dim=1)  # [bsz, n_views, feat_dim]
    features, all_labels = gather_with_grad(features), gather(labels)  # no-ops in one process
    stats = {}
    if opt.method == 'RASCAL':
        loss = criterion(features, all_labels, gather(sample_idx.to(opt.device)))
        stats = {f'rascal/{k}': v for k, v in criterion.last_stats.items()}
    else:
        loss = criterion(features, all_labels if opt.method == 'SupCon' else None)
    if carrot is not None:
        # rows of h are view-major like the images, so labels are repeated (not interleaved)
        h, params = (h_enc, model.head.parameters()) if opt.carrot_on == 'encoder' else (h_proj, ())
        loss, carrot_stats = carrot_term(opt, carrot, loss, h, labels.repeat(n_views), params)
        stats.update(carrot_stats)
    return loss, stats


def knn_monitor(opt, model):
    """``evaluate_epoch`` for ``--knn_every N``: weighted kNN top-1 of encoder features on the test
    split, every N epochs and at the last (``knn/acc``; with coarse training also ``knn/acc_fine``).
    Features are extracted once per evaluation; coarse labels are the fine ones mapped."""
    transform = build_transform(opt, 'eval')
    memory = build_loader(opt, build_dataset(opt, True, transform, 'fine'), train=False)
    test = build_loader(opt, build_dataset(opt, False, transform, 'fine'), train=False)
    n_fine = num_classes(memory.dataset)
    # metric -> (fine label -> training label, number of classes)
    label_maps = {'knn/acc': (torch.arange(n_fine, device=opt.device), n_fine)}
    if opt.label_granularity == 'coarse':
        mapping, classes = coarse_labels(opt.dataset)
        label_maps = {'knn/acc': (torch.as_tensor(mapping, device=opt.device), len(classes)),
                      'knn/acc_fine': label_maps['knn/acc']}

    def evaluate_epoch(epoch):
        if epoch % opt.knn_every and epoch != opt.epochs:
            return {}
        model.eval()
        bank, bank_y = extract_features(opt, model.encoder, memory)
        feats, y = extract_features(opt, model.encoder, test)
        out = {}
        for key, (to, n_cls) in label_maps.items():
            pred = knn_predict(bank, to[bank_y], feats, n_cls, opt.knn_k, opt.knn_t)
            out[key] = 100.0 * (pred == to[y]).float().mean().item()
        return out
    return evaluate_epoch


def main(argv=None):
    opt = parse_option('supcon', argv)
    set_seed(opt.seed + opt.rank)    # each torchrun process augments differently; DDP syncs the weights
    train_set = build_dataset(opt, True, TwoCropTransform(build_transform(opt, 'contrastive')))
    if opt.method == 'RASCAL':
        train_set = IndexedDataset(train_set)
    loader = build_loader(opt, train_set, train=True)
    model = prepare_model(opt, SupConResNet(opt.model, head=opt.head, feat_dim=opt.feat_dim))
    ddp_model = wrap_model(opt, model)    # the model itself in one process
    criterion = build_criterion(opt, train_set)
    optimizer = set_optimizer(opt, model.parameters())
    scaler = grad_scaler(opt)
    carrot = CARROT(opt.carrot_q_hi, opt.carrot_q_lo) if opt.carrot else None
    drift_hist = torch.zeros(DRIFT_BINS, device=opt.device)

    def step(batch):
        loss, stats = contrastive_loss(opt, ddp_model, model, criterion, carrot, *batch)
        if opt.method == 'RASCAL':
            drift_hist.add_(criterion.last_drift_hist)
        return loss, batch[1].shape[0], stats

    def train_epoch(epoch):
        ddp_model.train()
        drift_hist.zero_()
        metrics = train_loop(opt, loader, optimizer, scaler, epoch, step, opt.method)
        if opt.method == 'RASCAL':
            metrics['hist/rascal/rank_drift'] = drift_hist.cpu().clone()
        return metrics

    extra = {'criterion': criterion} if opt.method == 'RASCAL' else None
    print(f'run folder: {opt.run_folder}')
    fit(opt, model, optimizer, train_epoch, knn_monitor(opt, model) if opt.knn_every else None, extra=extra)
    print(f'checkpoint: {opt.run_folder}/last.pth')


if __name__ == '__main__':
    run_cli(main)
