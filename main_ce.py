"""Cross-entropy baseline (an encoder and a linear layer trained end to end), optionally with
CARROT on the penultimate features (--carrot). Reports test accuracy, NLL and ECE.

    python main_ce.py --dataset digits --epochs 30 --batch_size 128 --learning_rate 0.1 --cosine
"""
import torch.nn.functional as F

from data import build_dataset, build_loader, build_transform, class_counts, num_classes
from distributed import wrap_model
from engine import carrot_term, evaluate, fit, prepare_model, train_loop, write_results
from losses_carrot import CARROT
from networks import SupCEResNet
from options import parse_option
from util import accuracy, autocast, grad_scaler, run_cli, set_optimizer, set_seed, to_device


def ce_loss(opt, ddp_model, model, carrot, images, labels):
    """One step's cross-entropy (+ CARROT on the penultimate features) and statistics. ``ddp_model``
    is what the forward goes through (DDP under torchrun), ``model`` the module itself."""
    images, labels = to_device(opt, images), labels.to(opt.device)
    with autocast(opt):
        h, logits = ddp_model(images, parts=True)
    loss = F.cross_entropy(logits.float(), labels)   # this process's batch; DDP averages the gradients
    stats = {'acc': accuracy(logits, labels)[0]}
    if carrot is not None:
        loss, carrot_stats = carrot_term(opt, carrot, loss, h, labels, model.fc.parameters())
        stats.update(carrot_stats)
    return loss, stats


def main(argv=None):
    opt = parse_option('ce', argv)
    set_seed(opt.seed + opt.rank)    # each torchrun process augments differently; DDP syncs the weights
    train_set = build_dataset(opt, True, build_transform(opt, 'train'))
    test_set = build_dataset(opt, False, build_transform(opt, 'eval'))
    train_loader = build_loader(opt, train_set, train=True)
    counts = class_counts(train_set) if opt.dataset.endswith('_lt') else None
    test_loader = build_loader(opt, test_set, train=False)
    model = prepare_model(opt, SupCEResNet(opt.model, num_classes=num_classes(train_set)))
    ddp_model = wrap_model(opt, model)    # the model itself in one process
    optimizer = set_optimizer(opt, model.parameters())
    scaler = grad_scaler(opt)

    carrot = CARROT(opt.carrot_q_hi, opt.carrot_q_lo) if opt.carrot else None

    def step(batch):
        loss, stats = ce_loss(opt, ddp_model, model, carrot, *batch)
        return loss, batch[1].shape[0], stats

    def train_epoch(epoch):
        ddp_model.train()
        return train_loop(opt, train_loader, optimizer, scaler, epoch, step, 'CE')

    def evaluate_epoch(epoch):
        model.eval()
        return evaluate(opt, test_loader, model, 'test', num_classes(train_set), counts)

    print(f'run folder: {opt.run_folder}')
    last, best = fit(opt, model, optimizer, train_epoch, evaluate_epoch, select='test/acc')
    last = last or best
    write_results(opt, last, best, 'test/acc')
    print(f'best test top-1: {best["test/acc"]:.2f} (epoch {best["epoch"]})')
    print(f'final test top-1: {last["test/acc"]:.2f}, NLL {last["test/nll"]:.4f}, ECE {last["test/ece"]:.4f}')


if __name__ == '__main__':
    run_cli(main)
