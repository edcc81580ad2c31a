"""Cross-entropy baseline (an encoder and a linear layer trained end to end).

    python main_ce.py --dataset digits --epochs 30 --batch_size 128 --learning_rate 0.1 --cosine
"""
import torch.nn as nn

from data import build_dataset, build_loader, build_transform, num_classes
from engine import evaluate, fit, prepare_model, train_loop
from networks import SupCEResNet
from options import parse_option
from util import accuracy, autocast, grad_scaler, run_cli, set_optimizer, set_seed, to_device


def main(argv=None):
    opt = parse_option('ce', argv)
    set_seed(opt.seed)
    train_set = build_dataset(opt, True, build_transform(opt, 'train'))
    test_set = build_dataset(opt, False, build_transform(opt, 'eval'))
    train_loader = build_loader(opt, train_set, train=True)
    test_loader = build_loader(opt, test_set, train=False)
    model = prepare_model(opt, SupCEResNet(opt.model, num_classes=num_classes(train_set)))
    criterion = nn.CrossEntropyLoss()
    optimizer = set_optimizer(opt, model.parameters())
    scaler = grad_scaler(opt)

    def step(batch):
        images, labels = to_device(opt, batch[0]), batch[1].to(opt.device)
        with autocast(opt):
            logits = model(images)
        loss = criterion(logits.float(), labels)
        return loss, labels.shape[0], {'acc': accuracy(logits, labels)[0]}

    def train_epoch(epoch):
        model.train()
        return train_loop(opt, train_loader, optimizer, scaler, epoch, step, 'CE')

    def evaluate_epoch(epoch):
        model.eval()
        return evaluate(opt, test_loader, model, 'test')

    print(f'run folder: {opt.run_folder}')
    last, best = fit(opt, model, optimizer, train_epoch, evaluate_epoch, select='test/acc')
    print(f'best test top-1: {best["test/acc"]:.2f} (epoch {best["epoch"]})')
    print(f'final test top-1: {last.get("test/acc", best["test/acc"]):.2f}')


if __name__ == '__main__':
    run_cli(main)
