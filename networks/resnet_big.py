"""The encoders: ResNets with a CIFAR stem (3x3 conv, stride 1, no max-pool), as in SupContrast, or an ImageNet stem
(7x7 conv, stride 2, then a 3x3 max-pool of stride 2: ``stem='imagenet'``), and any model of timm by name
(``timm:<name>``, built without pretrained weights, its classifier removed).

``MODELS`` maps our ``--model`` names to ``(constructor, feature dim)``. Besides SupContrast's resnet18/34/50/101
there is ``resnet_tiny`` (one basic block per stage, widths 16-32-64-128): it is what the bundled ``digits`` data
needs and it trains in seconds on a CPU; ``resnet_nano`` is the same at half the width (8-16-32-64, a quarter of the
arithmetic), for smoke runs of a pipeline where the encoder's quality does not matter (the test suite's end-to-end
runs). :func:`build_encoder` builds either kind; every encoder it builds carries its feature width as
``feature_dim``.
"""
import functools

import torch
import torch.nn as nn
import torch.nn.functional as F

TIMM_PREFIX = 'timm:'
STEMS = ('cifar', 'imagenet')


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, in_planes, planes, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, in_planes, planes, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * 4)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_planes != planes * 4:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, planes * 4, 1, stride, bias=False), nn.BatchNorm2d(planes * 4))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return F.relu(out + self.shortcut(x))


class ResNet(nn.Module):
    """ResNet encoder: image ``[N, C, H, W]`` -> features ``[N, widths[-1]*expansion]``. ``stem``: ``'cifar'`` (a 3x3
    convolution of stride 1) or ``'imagenet'`` (a 7x7 convolution of stride 2 and a 3x3 max-pool of stride 2: a
    quarter of the resolution, for 224-px images)."""

    def __init__(self, block, num_blocks, in_channel=3, widths=(64, 128, 256, 512),
                 zero_init_residual=False, stem='cifar'):
        super().__init__()
        if stem not in STEMS:
            raise ValueError(f'unknown stem {stem!r} ({", ".join(STEMS)})')
        self.in_planes = widths[0]
        if stem == 'imagenet':
            self.conv1 = nn.Conv2d(in_channel, widths[0], 7, 2, 3, bias=False)
            self.pool = nn.MaxPool2d(3, 2, 1)
        else:
            self.conv1 = nn.Conv2d(in_channel, widths[0], 3, 1, 1, bias=False)
            self.pool = nn.Identity()
        self.bn1 = nn.BatchNorm2d(widths[0])
        layers = []
        for i, (width, n) in enumerate(zip(widths, num_blocks)):
            layers.append(self._make_layer(block, width, n, stride=1 if i == 0 else 2))
        self.layer1, self.layer2, self.layer3, self.layer4 = layers
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode='fan_out', nonlinearity='relu')
            elif isinstance(m, (nn.BatchNorm2d, nn.GroupNorm)):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)
        if zero_init_residual:
            for m in self.modules():
                if isinstance(m, Bottleneck):
                    nn.init.constant_(m.bn3.weight, 0)
                elif isinstance(m, BasicBlock):
                    nn.init.constant_(m.bn2.weight, 0)

    def _make_layer(self, block, planes, num_blocks, stride):
        layers = []
        for s in [stride] + [1] * (num_blocks - 1):
            layers.append(block(self.in_planes, planes, s))
            self.in_planes = planes * block.expansion
        return nn.Sequential(*layers)

    def forward(self, x):
        out = self.pool(F.relu(self.bn1(self.conv1(x))))
        out = self.layer4(self.layer3(self.layer2(self.layer1(out))))
        return out.mean(dim=(2, 3))        # global average pool; deterministic backward on CUDA, unlike
                                           # AdaptiveAvgPool2d's (which --deterministic refuses)


def resnet_tiny(**kwargs):
    return ResNet(BasicBlock, [1, 1, 1, 1], widths=(16, 32, 64, 128), **kwargs)


def resnet_nano(**kwargs):
    return ResNet(BasicBlock, [1, 1, 1, 1], widths=(8, 16, 32, 64), **kwargs)


def resnet18(**kwargs):
    return ResNet(BasicBlock, [2, 2, 2, 2], **kwargs)


def resnet34(**kwargs):
    return ResNet(BasicBlock, [3, 4, 6, 3], **kwargs)


def resnet50(**kwargs):
    return ResNet(Bottleneck, [3, 4, 6, 3], **kwargs)


def resnet101(**kwargs):
    return ResNet(Bottleneck, [3, 4, 23, 3], **kwargs)


MODELS = {
    'resnet_nano': (resnet_nano, 64),
    'resnet_tiny': (resnet_tiny, 128),
    'resnet18': (resnet18, 512),
    'resnet34': (resnet34, 512),
    'resnet50': (resnet50, 2048),
    'resnet101': (resnet101, 2048),
}


def parse_model_args(text):
    """``'depth=2,patch_size=8'`` -> ``{'depth': 2, 'patch_size': 8}`` (ints, floats, ``true``/``false``, else
    strings): ``--model_args``, passed to timm's constructor. A malformed entry is a ``ValueError``."""
    out = {}
    for item in filter(None, (part.strip() for part in (text or '').split(','))):
        key, sep, value = item.partition('=')
        if not sep or not key.strip().isidentifier():
            raise ValueError(f'--model_args takes key=value pairs separated by commas, got {item!r}')
        value = value.strip()
        for kind in (int, float):
            try:
                out[key.strip()] = kind(value)
                break
            except ValueError:
                continue
        else:
            out[key.strip()] = {'true': True, 'false': False}.get(value.lower(), value)
    return out


def timm_encoder(name, size, model_args=''):
    """timm's ``name`` without its classifier (``num_classes=0``: pooled features) and without pretrained weights
    (nothing is downloaded), for ``size``-pixel images where the model takes an image size (ViTs)."""
    import timm
    if not timm.is_model(name):
        raise ValueError(f'timm has no model {name!r} (timm.list_models() lists them)')
    kwargs = dict(pretrained=False, num_classes=0, **parse_model_args(model_args))
    try:
        encoder = timm.create_model(name, img_size=size, **kwargs)
        encoder.built_img_size = size           # built for this size (export.py's card says so)
    except TypeError as e:
        if 'img_size' not in str(e):
            raise
        encoder = timm.create_model(name, **kwargs)
        encoder.built_img_size = None
    return encoder


@functools.lru_cache(maxsize=16)
def timm_problem(name, size, model_args='', sizes=()):
    """``None`` if timm builds ``name`` (without ``timm:``) with ``--model_args`` for ``size``-pixel images and it
    runs on a ``size`` image and on each of ``sizes`` (multi-crop's small views); else one line saying what fails:
    the argument timm rejects (tried alone to name it), or the image size the model cannot take. Built on the CPU
    once per process for each set of arguments."""
    args = parse_model_args(model_args)
    try:
        encoder = timm_encoder(name, size, model_args)
    except Exception as e:          # anything timm's constructor raises for arguments passed through to it
        return _blame_model_args(name, size, args, e)
    for s, problem in _size_problems(encoder, (size, *sizes)):
        if problem is not None:
            return f'timm:{name} cannot take {s} x {s} images ({problem})'
    return None


@functools.lru_cache(maxsize=16)
def timm_sizes(name, size, model_args, candidates):
    """The image sizes among ``candidates`` that timm's ``name`` (built once, for ``size``-pixel images, with
    ``--model_args``) takes (multi-crop's small views), in the order given."""
    return tuple(s for s, problem in _size_problems(timm_encoder(name, size, model_args), candidates)
                 if problem is None)


def _size_problems(encoder, sizes):
    """``[(size, None or why the encoder cannot take a size x size image)]``: one forward of a 1-image batch each."""
    encoder.eval()
    out = []
    for s in sizes:
        try:
            with torch.no_grad():
                encoder(torch.zeros(1, 3, s, s))
            out.append((s, None))
        except Exception as e:
            out.append((s, _first_line(e)))
    return out


def _first_line(error):
    return f'{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ""}'[:200]


def _blame_model_args(name, size, args, error):
    """One line naming the ``--model_args`` entries that timm's ``name`` rejects, each tried alone."""
    culprits = []
    for key, value in args.items():
        try:
            timm_encoder(name, size, f'{key}={value}')
        except Exception as e:
            unknown = f"unexpected keyword argument '{key}'" in str(e)
            culprits.append(f'{key} is not an argument of timm:{name}' if unknown else
                            f'{key}={value} is a value timm:{name} rejects ({_first_line(e)})')
    if not culprits:
        return f'timm:{name} cannot be built with --model_args {format_model_args(args)} ({_first_line(error)})'
    return '--model_args: ' + '; '.join(culprits)


def format_model_args(args):
    return ','.join(f'{k}={v}' for k, v in args.items())


def is_model_name(name):
    """Whether ``name`` names an encoder :func:`build_encoder` can build (ours, or ``timm:<name>``)."""
    return name in MODELS or (name.startswith(TIMM_PREFIX) and len(name) > len(TIMM_PREFIX))


def build_encoder(name, stem='cifar', size=32, model_args=''):
    """``(encoder module, feature dim)`` for a ``--model`` name: ours (with ``stem``) or ``timm:<name>`` (with
    ``size`` and ``model_args``); the module carries the width as ``feature_dim``."""
    if name.startswith(TIMM_PREFIX):
        encoder = timm_encoder(name[len(TIMM_PREFIX):], size, model_args)
        dim = encoder.num_features
    elif name in MODELS:
        if model_args:
            raise ValueError(f'--model_args is for timm models (timm:<name>), not {name}')
        fn, dim = MODELS[name]
        encoder = fn(stem=stem)
    else:
        raise ValueError(f'unknown model {name!r}; choose from {", ".join(MODELS)} or timm:<name>')
    encoder.feature_dim = dim
    return encoder, dim


def projection_head(head, dim_in, feat_dim):
    """SupContrast's projection head: ``'linear'`` or ``'mlp'`` (Linear, ReLU, Linear)."""
    if head == 'linear':
        return nn.Linear(dim_in, feat_dim)
    if head == 'mlp':
        return nn.Sequential(nn.Linear(dim_in, dim_in), nn.ReLU(inplace=True), nn.Linear(dim_in, feat_dim))
    raise ValueError(f'head not supported: {head!r} (mlp or linear)')


class SupConResNet(nn.Module):
    """Encoder + projection head; ``forward`` returns L2-normalized ``[N, feat_dim]``."""

    def __init__(self, name='resnet50', head='mlp', feat_dim=128, **encoder):
        super().__init__()
        self.encoder, self.dim = build_encoder(name, **encoder)          # encoder: stem, size, model_args
        self.head = projection_head(head, self.dim, feat_dim)

    def forward(self, x, parts=False):
        """Normalized projections; with ``parts=True`` (encoder output, projection before normalization).

        ``parts`` is a forward argument (not a separate method) so that it goes through
        DistributedDataParallel's ``forward``, which gradient synchronization needs. ``x`` may be a list of batches of
        different image sizes (multi-crop): each goes through the encoder on its own (BatchNorm per size) and the
        outputs are concatenated in order, in one call (DDP allows one forward per backward)."""
        h = torch.cat([self.encoder(part) for part in x]) if isinstance(x, (list, tuple)) else self.encoder(x)
        z = self.head(h)
        return (h, z) if parts else F.normalize(z, dim=1)


class SupCEResNet(nn.Module):
    """Encoder + linear classifier, trained with cross-entropy; with ``head`` (``'mlp'``/``'linear'``) also a
    projection head beside the classifier (one-stage CE + SupCon, ``main_ce.py --supcon_weight``)."""

    def __init__(self, name='resnet50', num_classes=10, head=None, feat_dim=128, **encoder):
        super().__init__()
        self.encoder, self.dim = build_encoder(name, **encoder)          # encoder: stem, size, model_args
        self.fc = nn.Linear(self.dim, num_classes)
        if head is not None:
            self.head = projection_head(head, self.dim, feat_dim)

    def outputs(self, h):
        """What is trained on the encoder output ``h``: the logits, or ``(logits, projection)`` with a head."""
        logits = self.fc(h)
        return (logits, self.head(h)) if hasattr(self, 'head') else logits

    def forward(self, x, parts=False):
        """Logits; with ``parts=True`` (encoder output, :meth:`outputs`): one DDP-visible forward for all."""
        h = self.encoder(x)
        return (h, self.outputs(h)) if parts else self.fc(h)


class LinearClassifier(nn.Module):
    """Linear classifier on frozen encoder features of width ``dim`` (an int, or one of our model names); with
    ``norm``, MAE's normalized probe: a BatchNorm without affine parameters (``eps`` 1e-6) before the linear layer
    (He et al. 2022, "Masked Autoencoders Are Scalable Vision Learners", appendix A.3), which makes the probe's
    learning rate independent of the features' scale. Its running statistics are the plain average over the batches
    seen (``momentum=None``; the features are frozen, so their statistics do not drift): with PyTorch's default
    exponential average, which starts from a variance of 1, a short probe of features far smaller or larger than 1
    kept much of that start, and its evaluation then depended on the features' scale (docs/results.md, "The probe
    and the features' scale")."""

    def __init__(self, dim=2048, num_classes=10, norm=False):
        super().__init__()
        if not isinstance(dim, int):
            if dim not in MODELS:
                raise ValueError(f'unknown model {dim!r}; choose from {", ".join(MODELS)}')
            dim = MODELS[dim][1]
        self.norm = nn.BatchNorm1d(dim, affine=False, eps=1e-6, momentum=None) if norm else nn.Identity()
        self.fc = nn.Linear(dim, num_classes)

    def forward(self, features):
        return self.fc(self.norm(features))


class EncoderClassifier(nn.Module):
    """A stage-1 ``encoder`` with a :class:`LinearClassifier` on its features, trained end to end
    (``main_linear.py --finetune``)."""

    def __init__(self, encoder, classifier):
        super().__init__()
        self.encoder, self.classifier = encoder, classifier

    def forward(self, x):
        return self.classifier(self.encoder(x).float())
