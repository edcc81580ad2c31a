"""Analysis of a trained run: per-class vMF concentration, t-SNE maps, effective rank, training curves, RASCAL
rank drift.

    python analyze.py --ckpt save/SupCon/digits/<run>/last.pth

Writes PNG files and ``summary.md`` to ``<run>/analysis/`` (or ``--out``):
- ``kappa.png``: per-class von Mises-Fisher concentration ``kappa_hat`` of the L2-normalized encoder
  features of the training split (spec CARROT.md, Sra 2012); collapse shows as kappa growing without bound.
- ``tsne.png``: t-SNE of test-split encoder features coloured by class (and by fine class beside it
  when the encoder was trained on coarse labels).
- ``curves.png``: every per-epoch metric of ``metrics.csv``.
- ``rank_drift.png``: RASCAL's rank-drift distribution per epoch (``histograms.csv``), for RASCAL runs.
"""
import csv
import os

import core.requirements  # noqa: F401  (first: a Python without the requirements gets one line)

import numpy as np
import torch

from config.cli import run_cli
from core.flags import Parser, UserError
from data import DATASETS, build_dataset, build_loader, build_transform, coarse_labels, dataset_info
from evaluation.knn import extract_features, rankme
from runtime.checkpoint import load_checkpoint, load_encoder, run_checkpoint
from runtime.device import Runtime, resolve_device
from runtime.run_folder import writable_folder


def kappa_hat(features, labels):
    """Per-class vMF concentration ``{class: kappa_hat}`` of unit ``features`` ``[N, D]``:
    ``R = ||mean_i x_i||``, ``kappa_hat = R (D - R^2) / (1 - R^2)`` (Banerjee et al. 2005; Sra 2012).
    A class with one sample (or identical samples, R = 1) gets ``inf``."""
    features = torch.as_tensor(features, dtype=torch.float64)
    labels = torch.as_tensor(labels)
    dim = features.shape[1]
    out = {}
    for c in torch.unique(labels).tolist():
        r = features[labels == c].mean(0).norm().item()
        out[c] = float('inf') if r >= 1 - 1e-12 else r * (dim - r * r) / (1 - r * r)
    return out


def read_csv(path):
    with open(path, newline='') as f:
        return list(csv.DictReader(f))


def plot_curves(rows, path, title):
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator
    keys = [k for k in rows[0] if k != 'epoch' and any(r.get(k) for r in rows)]
    if not keys:
        return False
    cols = min(4, len(keys))
    n_rows = (len(keys) + cols - 1) // cols
    fig, axes = plt.subplots(n_rows, cols, figsize=(3.2 * cols, 2.4 * n_rows), squeeze=False)
    for ax, key in zip(axes.flat, keys):
        pts = [(int(r['epoch']), float(r[key])) for r in rows if r.get(key)]
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker='.' if len(pts) < 30 else None)
        ax.set_title(key, fontsize=8)
        ax.set_xlabel('epoch', fontsize=7)
        ax.set_ylabel(key.rsplit('/', 1)[-1], fontsize=7)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))       # epochs are whole
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(keys):]:
        ax.axis('off')
    fig.suptitle(title, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def plot_drift(hist_path, path, title):
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator
    with open(hist_path, newline='') as f:
        rows = [r for r in csv.reader(f) if r[0] != 'epoch' and r[1] == 'rascal/rank_drift']
    if not rows:
        return False
    epochs = [int(r[0]) for r in rows]
    counts = np.array([[float(c) for c in r[2:]] for r in rows])
    dens = counts / np.maximum(counts.sum(1, keepdims=True), 1)
    fig, ax = plt.subplots(figsize=(6, 3.5))
    im = ax.imshow(dens.T, origin='lower', aspect='auto', extent=(epochs[0] - 0.5, epochs[-1] + 0.5, 0, 1))
    ax.set_xlabel('epoch')
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel('rank drift (normalized)')
    ax.set_title(f'RASCAL rank-drift distribution per epoch\n{title}', fontsize=8)
    fig.colorbar(im, ax=ax, label='fraction of positives')
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


TSNE_MIN_POINTS = 5     # the perplexity (at least 2 here) must be below the number of points


def plot_tsne(feats, colourings, path, seed, run_title):
    import matplotlib.pyplot as plt
    from sklearn.manifold import TSNE
    xy = TSNE(n_components=2, init='pca', perplexity=min(30.0, max(2.0, (len(feats) - 1) / 3)),
              random_state=seed).fit_transform(feats)
    fig, axes = plt.subplots(1, len(colourings), figsize=(6.2 * len(colourings), 4.6), squeeze=False)
    for ax, (title, labels, names) in zip(axes.flat, colourings):
        cmap = plt.get_cmap('tab20' if max(labels) >= 10 else 'tab10')
        labels = np.asarray(labels)
        for c in sorted(set(labels.tolist())):      # one scatter per class: the legend names it
            at = labels == c
            ax.scatter(xy[at, 0], xy[at, 1], color=cmap(c % cmap.N), s=4, label=names[c] if c < len(names) else c)
        if len(set(labels.tolist())) <= 40:
            ax.legend(title=title, fontsize=6, title_fontsize=7, markerscale=3, loc='center left',
                      bbox_to_anchor=(1.0, 0.5), frameon=False, ncol=1 + len(set(labels.tolist())) // 20)
        ax.set_title(title)
        ax.set_xticks([])
        ax.set_yticks([])
    fig.suptitle(f't-SNE of test-split encoder features: {run_title}', fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_kappa(kappas, path, title):
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(max(4, 0.18 * len(kappas) + 2), 3))
    ax.bar(range(len(kappas)), [min(v, 1e6) for v in kappas.values()])
    ax.set_xlabel('class')
    ax.set_ylabel('kappa_hat')
    ax.set_title(title, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def step(text):
    """One line of progress (the work between two can take minutes on a CPU)."""
    print(f'analyze: {text}', flush=True)


def main(argv=None):
    import matplotlib
    matplotlib.use('Agg')
    p = Parser(description='Analysis of a trained run (vMF kappa, t-SNE, curves, rank drift).')
    p.add_argument('--ckpt', required=True, help='a checkpoint of main_supcon.py or main_ce.py (or SupContrast), or a '
                                                  'run folder (its last.pth)')
    p.add_argument('--dataset', choices=DATASETS, default=None, help="default: the checkpoint's")
    p.add_argument('--data_folder', default=None, help="default: the checkpoint's, else ./datasets/")
    p.add_argument('--out', default=None, help='output folder (default: <run>/analysis)')
    p.add_argument('--max_points', type=int, default=2000, help='test samples in the t-SNE map')
    p.add_argument('--batch_size', type=int, default=256)
    p.add_argument('--device', default='auto')
    p.add_argument('--seed', type=int, default=0)
    opt = p.parse_args(argv)
    opt.ckpt = run_checkpoint(opt.ckpt, '--ckpt')
    run = os.path.dirname(os.path.abspath(opt.ckpt))
    out = writable_folder(opt.out or os.path.join(run, 'analysis'), '--out')     # before any work
    config = load_checkpoint(opt.ckpt, 'checkpoint (--ckpt)').get('config', {})
    opt.dataset = opt.dataset or config.get('dataset', 'digits')
    opt.data_folder = opt.data_folder or config.get('data_folder') or './datasets/'
    info = dataset_info(opt.dataset)
    for key, default in (('size', info.size), ('mean', None), ('std', None),     # the run's training part too
                         ('imb_factor', 0.01), ('train_subset', 0), ('subset_seed', 0), ('val_split', 0.0),
                         ('split_seed', 0)):
        setattr(opt, key, config.get(key, default) if config.get('dataset') == opt.dataset else default)
    if info.mean_std is None and not (opt.mean and opt.std):
        raise UserError(f'--dataset {opt.dataset}: the checkpoint has no --mean/--std to reuse')
    opt.model, opt.num_workers, opt.amp, opt.channels_last, opt.augment = None, 0, 'none', False, 'cpu'
    opt.label_noise, opt.label_fraction = 0.0, 1.0      # the analysis reads clean labels, all of them
    opt.image_cache = config.get('image_cache', 0) if config.get('dataset') == opt.dataset else 0
    opt.device = resolve_device(opt.device)
    if opt.max_points < 10:
        raise UserError(f'--max_points must be >= 10, got {opt.max_points}')
    coarse = config.get('label_granularity') == 'coarse'
    runtime = Runtime(opt.device)
    encoder, opt.model = load_encoder(opt.ckpt, opt.model, info.model, runtime)
    transform = build_transform(opt, 'eval')
    method = config.get('method') or ('CE' if config.get('script') == 'ce' else '?')
    title = f'{os.path.basename(run)} ({method}, {opt.dataset})'
    summary = [f'# Analysis of `{opt.ckpt}`', '', f'encoder: {opt.model}, dataset: {opt.dataset}'
               + (' (trained on coarse labels)' if coarse else ''), '']

    # per-class vMF concentration on the training split (fine labels; coarse too when trained so)
    train_set = build_dataset(opt, 'train', transform, 'fine')
    step(f'1/4 encoder features of the {len(train_set)} training images, per-class vMF kappa')
    feats, labels = extract_features(runtime, encoder, build_loader(opt, train_set, train=False))
    feats, labels = feats.cpu(), labels.cpu()
    kappas = {'fine': kappa_hat(feats, labels)}
    to_coarse = torch.as_tensor(coarse_labels(opt.dataset)[0]) if coarse else None
    if coarse:
        kappas['coarse'] = kappa_hat(feats, to_coarse[labels])
    summary += ['## Per-class vMF concentration (training split, unit encoder features)', '',
                f'D = {feats.shape[1]}; kappa_hat = R(D - R^2)/(1 - R^2), R the mean resultant length.', '',
                '| labels | classes | mean | min | max |', '| --- | --- | --- | --- | --- |']
    for name, k in kappas.items():
        v = np.array(list(k.values()))
        summary.append(f'| {name} | {len(v)} | {v.mean():.2f} | {v.min():.2f} | {v.max():.2f} |')
        plot_kappa(k, os.path.join(out, f'kappa{"" if name == "fine" else "_coarse"}.png'),
                   f'vMF kappa_hat per {name} class: {title}')
    summary += ['', '![kappa](kappa.png)', '']

    # t-SNE of the test split
    test_set = build_dataset(opt, 'test', transform, 'fine')
    step(f'2/4 encoder features of the {len(test_set)} test images')
    test_feats, test_labels = extract_features(runtime, encoder, build_loader(opt, test_set, train=False))
    rng = np.random.RandomState(opt.seed)
    keep = np.sort(rng.permutation(len(test_labels))[:opt.max_points])
    test_labels = test_labels.cpu()[keep]
    class_names = [str(c) for c in getattr(test_set, 'classes', None) or range(int(test_labels.max()) + 1)]
    colourings = [('fine class' if coarse else 'class', test_labels.tolist(), class_names)]
    if coarse:
        groups = [', '.join(n for n, g in zip(class_names, coarse_labels(opt.dataset)[0]) if g == k)
                  for k in range(int(to_coarse.max()) + 1)]
        colourings.insert(0, ('coarse class (trained on)', to_coarse[test_labels].tolist(), groups))
    summary += ['## t-SNE of test-split encoder features', '']
    if len(keep) >= TSNE_MIN_POINTS:
        step(f'3/4 t-SNE of {len(keep)} test points (minutes for thousands on a CPU)')
        plot_tsne(test_feats.cpu().numpy()[keep], colourings, os.path.join(out, 'tsne.png'), opt.seed, title)
        summary += [f'{len(keep)} points.', '', '![t-SNE](tsne.png)', '']
    else:
        why = (f't-SNE skipped: the test split has {len(keep)} images, and a map needs at least {TSNE_MIN_POINTS} '
               '(its perplexity must be below the number of points)')
        print(f'note: {why}')
        summary += [why + '.', '']
    n_classes = len(set(test_labels.tolist()))
    summary += ['## Effective rank (RankMe) of the unit test-split encoder features', '',
                f'RankMe = {rankme(test_feats):.2f} of at most {min(test_feats.shape)} (Garrido et al. 2023). '
                f'A relative signal: SupCon\'s optimum has rank <= C - 1 = {n_classes - 1}; compare runs.', '']

    metrics = os.path.join(run, 'metrics.csv')
    curves = os.path.join(out, 'curves.png')
    step('4/4 RankMe, the training curves, summary.md')
    if os.path.exists(metrics) and read_csv(metrics) and plot_curves(read_csv(metrics), curves, title):
        rows = read_csv(metrics)
        last = {k: v for k, v in rows[-1].items() if v}
        summary += ['## Training curves', '', f'{len(rows)} epochs; last epoch:', '', '| metric | value |',
                    '| --- | --- |'] + [f'| {k} | {v} |' for k, v in last.items()] + ['', '![curves](curves.png)', '']
    hist = os.path.join(run, 'histograms.csv')
    if os.path.exists(hist) and plot_drift(hist, os.path.join(out, 'rank_drift.png'), title):
        summary += ['## RASCAL rank drift', '', '![rank drift](rank_drift.png)', '']
    with open(os.path.join(out, 'summary.md'), 'w') as f:
        f.write('\n'.join(summary))
    print(f'analysis written to {out}: ' + ', '.join(sorted(os.listdir(out))))


if __name__ == '__main__':
    run_cli(main)
