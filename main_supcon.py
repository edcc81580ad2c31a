"""Stage 1: supervised (SupCon) or self-supervised (SimCLR) contrastive pre-training.

    python main_supcon.py --dataset digits --epochs 30 --batch_size 128 --learning_rate 0.1 --cosine
"""
import torch

from data import TwoCropTransform, build_dataset, build_loader, build_transform
from engine import fit, prepare_model, train_loop
from losses import SupConLoss
from networks import SupConResNet
from options import parse_option
from util import autocast, grad_scaler, run_cli, set_optimizer, set_seed, to_device


def main(argv=None):
    opt = parse_option('supcon', argv)
    set_seed(opt.seed)
    train_set = build_dataset(opt, True, TwoCropTransform(build_transform(opt, 'contrastive')))
    loader = build_loader(opt, train_set, train=True)
    model = prepare_model(opt, SupConResNet(opt.model, head=opt.head, feat_dim=opt.feat_dim))
    criterion = SupConLoss(temperature=opt.temp)
    optimizer = set_optimizer(opt, model.parameters())
    scaler = grad_scaler(opt)

    def step(batch):
        images, labels = batch
        bsz = labels.shape[0]
        images = to_device(opt, torch.cat(images, dim=0))
        labels = labels.to(opt.device)
        with autocast(opt):
            features = model(images)
        features = torch.stack(torch.split(features, bsz, dim=0), dim=1)  # [bsz, n_views, feat_dim]
        loss = criterion(features, labels if opt.method == 'SupCon' else None)
        return loss, bsz, {}

    print(f'run folder: {opt.run_folder}')
    fit(opt, model, optimizer, lambda epoch: train_loop(opt, loader, optimizer, scaler, epoch, step, opt.method))
    print(f'checkpoint: {opt.run_folder}/last.pth')


if __name__ == '__main__':
    run_cli(main)
