"""Cross-entropy baseline (an encoder and a linear layer trained end to end), optionally logit-adjusted or balanced
softmax for a long tail (--loss) and with CARROT on the penultimate features (--carrot). Reports test accuracy, NLL
and ECE (of the plain logits).

    python main_ce.py --dataset digits --epochs 30 --batch_size 128 --learning_rate 0.1 --cosine
"""
from data import (
    TwoCropTransform,
    announce_label_fraction,
    build_dataset,
    build_loader,
    build_transform,
    class_counts,
    classes_to_classify,
    long_tail_class_counts,
    save_label_noise,
)
from engine import Optimization, evaluate, fit, setup, train_loop, write_results
from flags import call_hook
from options import parse_option
from schedule import Schedule, optimizer_for
from steps import CETraining
from util import run_cli


def main(argv=None):
    opt = setup(parse_option('ce', argv))
    # one-stage SupCon (--supcon_weight) trains on two views with SupCon's augmentation, CE on both
    two_views = opt.supcon_weight > 0
    transform = TwoCropTransform(build_transform(opt, 'contrastive')) if two_views else build_transform(opt, 'train')
    train_set = build_dataset(opt, True, transform)
    test_set = build_dataset(opt, False, build_transform(opt, 'eval'))
    train_loader = build_loader(opt, train_set, train=True, kind='contrastive' if two_views else 'train',
                                n_views=2 if two_views else None)
    announce_label_fraction(train_set)
    save_label_noise(opt.run_folder, train_set)
    counts = long_tail_class_counts(opt.dataset, train_set)
    test_loader = build_loader(opt, test_set, train=False)
    n_cls = classes_to_classify(train_set)
    ce = CETraining(opt, n_cls, class_counts(train_set))     # model, loss and CARROT
    model = ce.model
    optim = Optimization(optimizer_for(opt, model.parameters()), ce.runtime.grad_scaler(), call_hook(Schedule, opt))

    def step(batch, backward):
        loss, stats = ce.step(*batch, backward=backward)
        return loss, batch[1].shape[0], stats

    def train_epoch(epoch):
        ce.ddp_model.train()
        return train_loop(train_loader, optim, epoch, step, 'CE', opt.print_freq)

    def evaluate_epoch(epoch):
        model.eval()
        return evaluate(ce.runtime, test_loader, model, 'test', n_cls, counts)

    print(f'run folder: {opt.run_folder}')
    last, best = fit(opt, model, optim, train_epoch, evaluate_epoch, select='test/acc')
    last = last or best
    write_results(opt, last, best, 'test/acc', n_train=len(train_set))
    print(f'best test top-1: {best["test/acc"]:.2f} (epoch {best["epoch"]})')
    print(f'final test top-1: {last["test/acc"]:.2f}, NLL {last["test/nll"]:.4f}, ECE {last["test/ece"]:.4f}')


if __name__ == '__main__':
    run_cli(main)
