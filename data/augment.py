"""Augmentation on the training device (``--augment device``; definition: ``docs/AUGMENT.md``).

``data.build_transform`` describes SupContrast's per-image PIL pipeline. This module is the same pipeline
on a whole batch at once, on ``--device``: the parameters of every sample are drawn together by batched
samplers with torchvision's distributions (:func:`sample_crops`, :func:`sample_jitter`, ...), and each
operation is one function of a batch and its per-sample parameters (:func:`resized_crop`, :func:`hflip`,
:func:`rotate`, :func:`adjust_brightness`, ...). Images are ``[N, C, H, W]`` float in ``[0, 1]``.

:class:`BatchAugment` puts them together for one ``kind`` (``contrastive``, ``train``) and style
(``natural``, ``digits``); :class:`DeviceLoader` keeps an in-memory training split on the device as one
uint8 tensor and yields augmented batches with the structure of the DataLoader it replaces.
"""
import functools
import math

import numpy as np
import torch

from datasets_indexed import IndexedDataset
from runtime.rng import register_generator

from .views import PendingViews

GRAY = (0.2989, 0.587, 0.114)          # torchvision's RGB -> luma weights for tensors


# ---------------------------------------------------------------- operations (batch, per-sample parameters)
def resize_weights(start, length, in_size, out_size, flip=None):
    """``[N, out_size, in_size]`` interpolation matrices of a crop ``[start, start + length)`` of an axis of
    ``in_size`` pixels resized to ``out_size``: antialiased bilinear (a triangle filter stretched by the
    down-scaling factor, normalized over the pixels inside the crop), the rule of PIL's bilinear resize and of
    ``torch.nn.functional.interpolate(..., antialias=True)``; plain bilinear (``align_corners=False``, edges
    clamped) when up-scaling. ``start``, ``length`` ``[N]`` integer tensors; ``flip`` ``[N]`` bool: those rows
    get their output positions in reverse order (the crop mirrored)."""
    scale = length.float() / out_size                                             # [N]
    inv_support = 1 / scale.clamp(min=1.0)
    position = torch.arange(out_size, device=start.device, dtype=torch.float32)[None].expand(len(start), -1)
    if flip is not None:
        position = torch.where(flip[:, None], position.flip(1), position)        # [N, S]: small
    centre = (position + 0.5) * scale[:, None]
    x = torch.arange(in_size, device=start.device, dtype=torch.float32)[None, None] - start[:, None, None] + 0.5
    inside = (x > 0) & (x < length[:, None, None] + 0.5)
    w = (1 - ((x - centre[:, :, None]) * inv_support[:, None, None]).abs()).clamp_(min=0).mul_(inside)
    return w / w.sum(-1, keepdim=True)


_WEIGHT_TABLES = {}


def crop_weights(start, length, in_size, out_size, flip=None):
    """:func:`resize_weights` looked up in a table of every ``(flip, start, length)`` of an axis of up to 64
    pixels (computed once per sizes and device by :func:`resize_weights` itself, so the same numbers), or
    computed directly for larger inputs."""
    if in_size > 64:
        return resize_weights(start, length, in_size, out_size, flip)
    key = (in_size, out_size, str(start.device))
    if key not in _WEIGHT_TABLES:
        s, n = torch.meshgrid(torch.arange(in_size, device=start.device),
                              torch.arange(in_size + 1, device=start.device), indexing='ij')
        # every (start, length); only those with start + length <= in_size are ever looked up
        table = resize_weights(s.flatten(), n.flatten().clamp(min=1), in_size, out_size)
        table = table.reshape(in_size, in_size + 1, out_size, in_size)
        _WEIGHT_TABLES[key] = torch.stack([table, table.flip(2)])
    table = _WEIGHT_TABLES[key]
    return table[0 if flip is None else flip.long(), start, length]


def resized_crop(images, top, left, height, width, size, flip=None, scale=1.0):
    """Crop ``[top, top + height) x [left, left + width)`` of each image and resize it to ``size x size``
    (torchvision's ``resized_crop`` with bilinear interpolation and antialias), as two batched matrix
    products: ``Wy @ image @ Wx^T``. ``flip`` ``[N]``: then mirror those images (the rows of their ``Wx``
    reversed: the same as :func:`hflip` afterwards, at no cost); ``scale``: multiply the pixels (folded into
    ``Wy``)."""
    n, c, h, w = images.shape
    wy = crop_weights(top, height, h, size).to(images.dtype)                   # [N, S, H]
    wx = crop_weights(left, width, w, size, flip).to(images.dtype)             # [N, S, W]
    if scale != 1.0:
        wy = wy * scale
    rows = torch.bmm(images.reshape(n, c * h, w), wx.transpose(1, 2)).reshape(n, c, h, size)
    return torch.matmul(wy[:, None], rows)                                     # [N, C, S, S]


def hflip(images, flip):
    """Mirror the images where ``flip`` ``[N]`` is true."""
    return torch.where(flip[:, None, None, None], images.flip(-1), images)


def rotate(images, degrees):
    """Rotate each image by ``degrees`` ``[N]`` (counter-clockwise) about its centre, nearest neighbour,
    zeros outside: torchvision's ``rotate`` (same grid: pixel centres, ``align_corners=False``)."""
    n, _, h, w = images.shape
    rad = torch.deg2rad(-degrees.double())          # torchvision builds the inverse matrix of -angle
    cos, sin = rad.cos(), rad.sin()
    theta = torch.stack([torch.stack([cos, sin, torch.zeros_like(cos)], -1),
                         torch.stack([-sin, cos, torch.zeros_like(cos)], -1)], 1).to(images.dtype)  # [N, 2, 3]
    xs = torch.linspace((1.0 - w) * 0.5, (w - 1.0) * 0.5, w, device=images.device, dtype=images.dtype)
    ys = torch.linspace((1.0 - h) * 0.5, (h - 1.0) * 0.5, h, device=images.device, dtype=images.dtype)
    base = torch.stack([xs[None, :].expand(h, w), ys[:, None].expand(h, w), torch.ones(h, w, device=images.device,
                                                                                     dtype=images.dtype)], -1)
    scaled = theta.transpose(1, 2)                                                 # [N, 3, 2]: columns x, y
    scaled = torch.stack([scaled[..., 0] / (0.5 * w), scaled[..., 1] / (0.5 * h)], -1)   # no constant from the host
    grid = base.reshape(1, h * w, 3).expand(n, -1, -1).bmm(scaled).reshape(n, h, w, 2)
    return torch.nn.functional.grid_sample(images, grid, mode='nearest', padding_mode='zeros', align_corners=False)


def luma(images):
    """``[N, 1, H, W]`` grayscale with torchvision's weights."""
    r, g, b = images.unbind(1)
    return (r * GRAY[0] + g * GRAY[1] + b * GRAY[2])[:, None]


def _blend(a, b, factor):
    return (factor[:, None, None, None] * a + (1 - factor[:, None, None, None]) * b).clamp(0, 1)


def adjust_brightness(images, factor):
    return (images * factor[:, None, None, None]).clamp(0, 1)


def adjust_contrast(images, factor):
    """Blend with the mean gray level of each image."""
    return _blend(images, luma(images).mean((1, 2, 3), keepdim=True), factor)


def adjust_saturation(images, factor):
    """Blend with each image's grayscale version."""
    return _blend(images, luma(images), factor)


def adjust_hue(images, shift):
    """Rotate the hue of each image by ``shift`` ``[N]`` turns (in ``[-0.5, 0.5]``): torchvision's HSV round
    trip in closed form. The value (max) and the chroma ``d = max - min`` stay; the hue in sixths of a turn is
    ``h = 2 i + (next - after) / d`` with ``i`` the index of the first largest channel (R, G, B) and ``next``,
    ``after`` the two channels that follow it cyclically, and ``u = h + 6 shift`` reduced to ``[0, 6)``. Channel
    ``c`` becomes ``max - d T_c(u)`` with the trapezoid ``T_c(u) = clamp(min(k, 4 - k), 0, 1)``, ``k = (u + 5, 3,
    1 for R, G, B) mod 6``, written without the ``mod``: ``T_R = clamp(min(u - 1, 5 - u))``, ``T_G = clamp(max(1 -
    u, min(u - 3, 7 - u)))``, ``T_B = clamp(max(min(u + 1, 3 - u), u - 5))`` for ``u`` in ``[-1, 7]`` (so the
    rounding of the reduction cannot leave them). Branches are products with 0/1 masks made by ``sign`` (on a
    CPU ``torch.where`` and comparisons cost as much as 5 to 20 multiplications). Gray pixels (``d = 0``) keep
    their value; ties for the largest channel lie on a sextant edge, where both branches give the same hue."""
    r, g, b = images.unbind(1)
    maxc, minc = images.amax(1, keepdim=True), images.amin(1, keepdim=True)
    delta = maxc - minc
    is_r = 1 + torch.sign(r - maxc[:, 0])               # 1 where R is the largest, else 0 (x - y = 0 iff x = y)
    not_r = 1 - is_r                                    # ties as torchvision breaks them: R, then G, then B
    is_g = (1 + torch.sign(g - maxc[:, 0])) * not_r
    is_b = not_r - is_g
    numerator = is_r * (g - b) + is_g * (b - r) + is_b * (r - g)
    h = is_g * 2 + is_b * 4 + numerator / delta[:, 0].clamp(min=torch.finfo(images.dtype).tiny)
    u = (h + 6 * shift[:, None, None])[:, None]
    u = u - 6 * torch.floor(u / 6)
    if torch.compiler.is_compiling():     # the same numbers; the compiler takes no out= into a slice
        t = torch.cat([torch.minimum(u - 1, 5 - u), torch.maximum(1 - u, torch.minimum(u - 3, 7 - u)),
                       torch.maximum(torch.minimum(u + 1, 3 - u), u - 5)], 1)
    else:
        t = torch.empty_like(images)
        torch.minimum(u - 1, 5 - u, out=t[:, 0:1])
        torch.maximum(1 - u, torch.minimum(u - 3, 7 - u), out=t[:, 1:2])
        torch.maximum(torch.minimum(u + 1, 3 - u), u - 5, out=t[:, 2:3])
    return (maxc - delta * t.clamp_(0, 1)).clamp_(0, 1)


def grayscale(images, where, sync_free=None):
    """Replace the images where ``where`` ``[N]`` is true by their grayscale version (3 equal channels). On a CPU
    only those rows are computed; elsewhere every row, kept by arithmetic selection (no host synchronization).
    ``sync_free``: force one form (default: the second on any device but the CPU)."""
    if images.device.type != 'cpu' if sync_free is None else sync_free:
        return _pick(where, luma(images), images)
    out = images.clone()
    out[where] = luma(images[where]).expand(-1, images.shape[1], -1, -1)
    return out


def _pick(where, a, b):
    """``a`` for the images where ``where`` ``[N]`` is true, else ``b`` (broadcast to one shape): ``a m + b (1 -
    m)`` with ``m`` in {0, 1}, which is ``torch.where``'s value for finite inputs, and on a CPU several times
    faster than it."""
    m = where.to(b.dtype)[:, None, None, None]
    return a * m + b * (1 - m)


def normalize(images, mean, std):
    """``(x - mean) / std`` per channel, as one multiply-add (:func:`normalization`'s constants)."""
    # in a compiled graph the constants are the graph's own (the cache is the host's: the compiler would warn)
    make = normalization.__wrapped__ if torch.compiler.is_compiling() else normalization
    scale, shift = make(tuple(map(float, mean)), tuple(map(float, std)), images.device, images.dtype)
    return torch.addcmul(shift, images, scale)


@functools.lru_cache(maxsize=32)
def normalization(mean, std, device, dtype):
    """``(scale, shift)`` ``[1, C, 1, 1]`` on ``device``: ``1 / std`` and ``-mean / std`` (computed in float64 on the
    host, then rounded to ``dtype``). Made once per device and dtype and kept there, so a batch copies nothing to
    the device (each blocking host-to-device copy is a wait for the device)."""
    mean = torch.as_tensor(mean, dtype=torch.float64)
    std = torch.as_tensor(std, dtype=torch.float64)
    pair = torch.stack([1 / std, -mean / std]).to(dtype)[:, None, :, None, None]
    return tuple(pair.to(device, non_blocking=True).unbind(0))


JITTER_OPS = (adjust_brightness, adjust_contrast, adjust_saturation, adjust_hue)   # ColorJitter's order of indices


# ---------------------------------------------------------------- samplers (torchvision's distributions, batched)
def uniform(generator, n, low, high, device):
    return torch.rand(n, generator=generator, device=device) * (high - low) + low


def sample_crops(generator, n, height, width, scale, ratio, device, tries=10):
    """``RandomResizedCrop.get_params`` for ``n`` images at once: up to ``tries`` draws of an area fraction in
    ``scale`` and a log-uniform aspect ratio in ``ratio``; the first draw whose rounded box fits is kept, else
    the central crop of torchvision's fall-back; then a uniform position. Returns ``top, left, h, w`` ``[n]``."""
    area = height * width
    target = area * uniform(generator, (n, tries), scale[0], scale[1], device).double()
    aspect = torch.exp(uniform(generator, (n, tries), math.log(ratio[0]), math.log(ratio[1]), device).double())
    w = torch.round(torch.sqrt(target * aspect))
    h = torch.round(torch.sqrt(target / aspect))
    fits = (w > 0) & (w <= width) & (h > 0) & (h <= height)
    first = torch.argmax(fits.int(), 1)                                          # the first draw that fits
    found = fits.any(1)
    w = w.gather(1, first[:, None])[:, 0].long()
    h = h.gather(1, first[:, None])[:, 0].long()
    in_ratio = width / height                                                    # torchvision's fall-back
    if in_ratio < min(ratio):
        fw, fh = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        fw, fh = int(round(height * max(ratio))), height
    else:
        fw, fh = width, height
    w = torch.where(found, w, torch.full_like(w, fw))
    h = torch.where(found, h, torch.full_like(h, fh))
    u = torch.rand(2, n, generator=generator, device=device)
    top = torch.where(found, (u[0] * (height - h + 1)).long().clamp(max=height - h), (height - h) // 2)
    left = torch.where(found, (u[1] * (width - w + 1)).long().clamp(max=width - w), (width - w) // 2)
    return top, left, h, w


def sample_jitter(generator, n, brightness, contrast, saturation, hue, device):
    """``ColorJitter.get_params`` for ``n`` images: factors uniform in ``[max(0, 1 - x), 1 + x]`` (hue in
    ``[-hue, hue]``) and a uniformly random order of the four operations per image (``[n, 4]``, indices into
    :data:`JITTER_OPS`)."""
    factors = [uniform(generator, n, max(0.0, 1 - x), 1 + x, device) for x in (brightness, contrast, saturation)]
    factors.append(uniform(generator, n, -hue, hue, device))
    order = torch.argsort(torch.rand(n, 4, generator=generator, device=device), 1)
    return torch.stack(factors, 1), order


def jitter_groups(order, apply):
    """A key per image for :func:`color_jitter`'s CPU form: its order of the four operations as a number in
    ``[0, 256)``, or -1 without jitter. Sorting a batch by it makes every group of equal keys contiguous."""
    code = (order * torch.tensor([64, 16, 4, 1], device=order.device)).sum(1)
    return torch.where(apply, code, torch.full_like(code, -1))


def color_jitter(images, factors, order, apply, sync_free=None):
    """The four colour operations in each image's own order, on the images where ``apply`` is true.

    On a CPU the rows are grouped by their order (:func:`jitter_groups`; each group's four operations run on its
    contiguous rows: least arithmetic); on an accelerator (:func:`_color_jitter_masked`) every pass runs on every
    row and a 0/1 mask keeps the right ones, which needs no host synchronization (selecting rows would wait for
    the GPU). Both give each image the arithmetic it would get alone. ``sync_free``: force one form (default:
    the second on any device but the CPU)."""
    sync_free = images.device.type != 'cpu' if sync_free is None else sync_free
    if not sync_free:
        return _color_jitter_grouped(images, factors, order, apply)
    return _color_jitter_masked(images, factors, order, apply)


def _blend_pass(images, ops, factors, chosen):
    """One of brightness (0), contrast (1) or saturation (2) per row (``ops`` ``[N]``), on the rows ``chosen``:
    all three are ``clamp(f x + (1 - f) g)`` with ``g`` = 0, the mean gray level or the gray image, so one pass
    does all three, each row's arithmetic that of its own operation alone (``g = mean m_c + gray m_s`` is exact
    for 0/1 masks)."""
    f = factors.gather(1, ops[:, None])[:, :, None, None]
    gray = luma(images)
    g = gray.mean((1, 2, 3), keepdim=True) * (ops == 1).to(images.dtype)[:, None, None, None] \
        + gray * (ops == 2).to(images.dtype)[:, None, None, None]
    return _pick(chosen, (f * images + (1 - f) * g).clamp(0, 1), images)


def _color_jitter_masked(images, factors, order, apply):
    """:func:`color_jitter`'s accelerator form: each image's blends before its hue (3 masked passes), the hue
    once (the expensive operation, on every row), then its blends after the hue (3 passes): 6 cheap passes and 1
    hue instead of all four operations at each of the four positions. Fixed shapes throughout."""
    hue = len(JITTER_OPS) - 1
    hue_at = (order == hue).to(torch.int8).argmax(1)                          # the hue's position in the order
    blends = order.gather(1, torch.argsort((order == hue).to(torch.int8), dim=1, stable=True)[:, :hue])   # [N, 3]
    out = images
    for k in range(hue):                                                        # blends before the hue
        out = _blend_pass(out, blends[:, k], factors, apply & (hue_at > k))
    out = _pick(apply, adjust_hue(out, factors[:, hue]), out)
    for k in range(hue):                                                        # blends after it
        out = _blend_pass(out, blends[:, k], factors, apply & (hue_at <= k))
    return out


def _color_jitter_grouped(images, factors, order, apply):
    """:func:`color_jitter`'s CPU form. The images sorted by :func:`jitter_groups` (no copy when they come sorted,
    as :class:`BatchAugment` passes them; the images without jitter first) form a tree of contiguous runs: at
    position ``p`` the images that share their first ``p + 1`` operations are adjacent (4, 12, 24 and 24 runs),
    so each run gets its ``p``-th operation in one call: 64 calls for a batch, every image its own four in its
    own order."""
    code = jitter_groups(order, apply)
    presorted = bool((code[1:] >= code[:-1]).all())
    idx = None if presorted else torch.argsort(code, stable=True)
    x, f, o, code = (images.clone(), factors, order, code) if presorted else \
        (images[idx], factors[idx], order[idx], code[idx])
    first = int((code < 0).sum())                                       # the rows without jitter
    for position in range(4):
        prefixes, counts = torch.unique_consecutive(code[first:] // 4 ** (3 - position), return_counts=True)
        start = first
        for prefix, count in zip(prefixes.tolist(), counts.tolist()):
            op_index = prefix % 4
            rows = slice(start, start + count)
            x[rows] = JITTER_OPS[op_index](x[rows], f[rows, op_index])
            start += count
    if presorted:
        return x
    out = torch.empty_like(images)
    out[idx] = x
    return out


# ---------------------------------------------------------------- the pipeline
class BatchAugment:
    """``data.build_transform(opt, kind)`` for a batch of uint8 images ``[N, C, H, W]`` on one device.

    ``style``: ``'natural'`` (RandomResizedCrop scale (0.2, 1) + horizontal flip) or ``'digits'``
    (RandomResizedCrop scale (0.5, 1), ratio (0.8, 1.25) + rotation up to 10 degrees, nearest); ``kind
    'contrastive'`` adds ColorJitter(0.4, 0.4, 0.4, 0.1) with probability 0.8 and grayscale with
    probability 0.2. Then normalization with ``mean``, ``std``; ``kind 'eval'`` is the normalization alone
    (the in-memory datasets' evaluation transform). Draws from ``generator`` only."""

    def __init__(self, size, mean, std, style, kind, generator=None):
        if kind not in ('contrastive', 'train', 'eval') or style not in ('natural', 'digits'):
            raise ValueError(f'no batched augmentation for kind {kind!r}, style {style!r}')
        self.size, self.mean, self.std, self.style, self.kind = size, mean, std, style, kind
        self.generator = generator
        self.scale, self.ratio = ((0.5, 1.0), (0.8, 1.25)) if style == 'digits' else ((0.2, 1.0), (3 / 4, 4 / 3))

    def sample(self, n, height, width, device):
        """Every random parameter of ``n`` images, as a dict of ``[n, ...]`` tensors."""
        if self.kind == 'eval':
            return {}
        g = self.generator
        top, left, h, w = sample_crops(g, n, height, width, self.scale, self.ratio, device)
        params = dict(top=top, left=left, height=h, width=w)
        if self.style == 'digits':
            params['degrees'] = uniform(g, n, -10.0, 10.0, device)
        else:
            params['flip'] = torch.rand(n, generator=g, device=device) < 0.5
        if self.kind == 'contrastive':
            params['jitter'] = torch.rand(n, generator=g, device=device) < 0.8
            params['factors'], params['order'] = sample_jitter(g, n, 0.4, 0.4, 0.4, 0.1, device)
            params['gray'] = torch.rand(n, generator=g, device=device) < 0.2
        return params

    CPU_CHUNK = 128     # on a CPU, images per crop pass: 1.5 MB temporaries stay in the cache (1.8x faster than 512)

    def apply(self, images, params):
        """The pipeline with given parameters: uint8 ``[N, C, H, W]`` -> normalized float ``[N, C, size, size]``.
        Every operation is per image, so on a CPU the batch runs in the order that groups its colour jitter
        (:func:`jitter_groups`), the crop ``CPU_CHUNK`` images at a time, and each image then goes back to its
        own row: the same numbers as one pass over the batch in its own order (without autograd's bookkeeping:
        ``inference_mode`` inside, a plain tensor out)."""
        if self.kind == 'eval':
            return normalize(images.float() / 255.0, self.mean, self.std)
        if images.device.type != 'cpu':
            return self._apply(images, params)
        idx = torch.argsort(jitter_groups(params['order'], params['jitter']), stable=True) \
            if self.kind == 'contrastive' else None
        out = torch.empty(images.shape[0], images.shape[1], self.size, self.size)
        with torch.inference_mode():
            if idx is None:
                out.copy_(self._apply(images, params, crop_chunk=self.CPU_CHUNK))
            else:
                out[idx] = self._apply(images[idx], {k: v[idx] for k, v in params.items()}, crop_chunk=self.CPU_CHUNK)
        return out

    def _apply(self, images, params, sync_free=None, crop_chunk=None):
        """:meth:`apply` in one pass over ``images`` (``sync_free``: as in :func:`color_jitter`), the crop
        ``crop_chunk`` images at a time if given."""
        n = images.shape[0]

        def crop(rows):
            flip = params['flip'][rows] if 'flip' in params else None
            return resized_crop(images[rows].float(), params['top'][rows], params['left'][rows],
                                params['height'][rows], params['width'][rows], self.size, flip, scale=1 / 255.0)

        if crop_chunk is None or n <= crop_chunk:
            x = crop(slice(None))
        else:
            x = torch.empty(n, images.shape[1], self.size, self.size)
            for i in range(0, n, crop_chunk):
                x[i:i + crop_chunk] = crop(slice(i, i + crop_chunk))
        if self.style == 'digits':
            x = rotate(x, params['degrees'])
        if self.kind == 'contrastive':
            x = color_jitter(x, params['factors'], params['order'], params['jitter'], sync_free)
            x = grayscale(x, params['gray'], sync_free)
        return normalize(x, self.mean, self.std)

    def apply_in_graph(self, images, params):
        """:meth:`apply` of a training kind in its form without host reads on every device (on a GPU the same numbers;
        on a CPU within float rounding of its own form), for a compiled step (``data.views.PendingViews``)."""
        return self._apply(images, params, sync_free=True)

    def __call__(self, images):
        return self.apply(images, self.sample(images.shape[0], images.shape[-2], images.shape[-1], images.device))


# ---------------------------------------------------------------- the training data on the device
def augment_generator(device, seed, rank=0):
    """This process's augmentation generator on ``device``, seeded from ``--seed`` and the rank (its state
    travels in checkpoints with the other RNG states, ``runtime.get_rng_state``)."""
    g = torch.Generator(device=device)
    g.manual_seed((seed * 1_000_003 + rank * 7_919 + 0x5EED) % 2 ** 63)
    return register_generator('augment', g)


class DeviceLoader:
    """The loaders of ``--augment device``: the split lives on ``device`` as one uint8 tensor. For training,
    an epoch is a permutation of its indices (the shard ``DistributedSampler(shuffle=True, seed=--seed)`` would
    give this process) and each batch is augmented by :class:`BatchAugment` on the device; for evaluation
    (``kind 'eval'``) every process reads the whole split in order, normalized. No workers.

    Yields what the DataLoader it replaces yields: ``(views list, labels)`` with ``n_views`` (contrastive),
    ``(images, labels)`` without, and the dataset indices last for an :class:`IndexedDataset`.

    ``images``, ``targets``: the split's uint8 ``[N, H, W, C]`` array and labels (``data.in_memory_images``);
    ``batch_size``: this process's; ``size``, ``mean_std``, ``style``: as :class:`BatchAugment`; ``seed``,
    ``world_size``, ``rank``: the shuffle and this process's shard (training only); ``drop_last``: leave out an
    epoch's last, smaller batch (as ``DataLoader(drop_last=True)``)."""

    def __init__(self, dataset, images, targets, kind, *, device, batch_size, size, mean_std, style, n_views=None,
                 seed=0, world_size=1, rank=0, channels_last=False, drop_last=False):
        self.dataset, self.n_views, self.with_ids = dataset, n_views, isinstance(dataset, IndexedDataset)
        self.images = torch.from_numpy(np.ascontiguousarray(images)).permute(0, 3, 1, 2).contiguous().to(device)
        self.labels = torch.as_tensor(targets, dtype=torch.long)     # on the host, as a DataLoader yields them
        self.train = kind != 'eval'
        self.batch_size = batch_size
        self.seed, self.epoch = seed, 0
        self.world_size, self.rank = (world_size, rank) if self.train else (1, 0)
        self.channels_last, self.drop_last = channels_last, drop_last
        self.augment = BatchAugment(size, *mean_std, style, kind,
                                    augment_generator(device, seed, rank) if self.train else None)
        self.sampler = self                      # loop.train_loop calls loader.sampler.set_epoch(epoch)
        self.pending = False                     # data.views.pend_augmentation: yield PendingViews

    def set_epoch(self, epoch):
        self.epoch = epoch

    def indices(self):
        """This process's indices of the epoch, on the host: ``DistributedSampler``'s shuffle, padding and shard."""
        n = self.images.shape[0]
        if not self.train:
            return torch.arange(n)
        g = torch.Generator()
        g.manual_seed(self.seed + self.epoch)
        order = torch.randperm(n, generator=g)
        total = math.ceil(n / self.world_size) * self.world_size
        if total > n:
            order = torch.cat([order, order[:total - n]])
        return order[self.rank:total:self.world_size]

    def __len__(self):
        per_process = math.ceil(self.images.shape[0] / self.world_size)
        return per_process // self.batch_size if self.drop_last else math.ceil(per_process / self.batch_size)

    def _augmented(self, x):
        out = self.augment(x)
        return out.contiguous(memory_format=torch.channels_last) if self.channels_last else out

    def __iter__(self):
        """Batches as a DataLoader yields them: images on the device; labels and dataset ids on the host, where
        the losses build what depends on their values without waiting for the device (the epoch's order is
        copied to the device once)."""
        order = self.indices()
        on_device = order.to(self.images.device, non_blocking=True)
        for start in range(0, len(self) * self.batch_size, self.batch_size):
            idx = order[start:start + self.batch_size]
            x = self.images[on_device[start:start + self.batch_size]]
            if self.pending and self.train:      # drawn here, applied in the step's compiled graph
                x = x.repeat(self.n_views or 1, 1, 1, 1)
                params = self.augment.sample(x.shape[0], x.shape[-2], x.shape[-1], x.device)
                images = PendingViews(x, params, self.augment.apply_in_graph, self.n_views or 1, self.channels_last)
            elif self.n_views:                   # all views in one call: bigger groups, fewer operations
                images = list(self._augmented(x.repeat(self.n_views, 1, 1, 1)).chunk(self.n_views))
            else:
                images = self._augmented(x)
            batch = (images, self.labels[idx])
            yield batch + (idx,) if self.with_ids else batch
