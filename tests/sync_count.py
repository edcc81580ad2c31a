"""Counting, on a CPU, the operations that would make the host wait for a CUDA device (a host synchronization).

A CPU run cannot observe a synchronization, but it runs the same operators. :class:`SyncCounter` is a
``TorchDispatchMode`` that records every operator call whose CUDA form waits for the device, because its
result's shape or value is needed on the host:

- reading a value: ``_local_scalar_dense`` (``.item()``, ``int(t)``, ``float(t)``, ``bool(t)``, ``if t:``);
- data-dependent shapes: ``nonzero``, ``unique`` (all forms), ``masked_select``, boolean-mask indexing and
  index assignment, ``repeat_interleave`` without ``output_size``, ``bincount`` (CUDA's computes its size from
  the maximum), ``histc`` without a range;
- ``equal`` (a Python bool);
- blocking copies to the device, which on CUDA wait for the device to finish the copy: ``.to(device)`` of host
  data without ``non_blocking=True``, ``torch.tensor(data, device=...)`` / ``torch.as_tensor(data, device=...)``
  from host data (a constant made per step: make it on the device once), indexing device data with host
  indices (the indices are copied to the device first), and an index assignment of host data into device data
  (``dev[idx] = True``, ``dev[idx] = host_tensor``: Python's ``__setitem__`` wraps a Python number in a host
  scalar tensor when the target is on CUDA, and ``index_put_`` copies it to the device, a blocking copy), and
  ``dev.copy_(host)`` without ``non_blocking=True`` (``torch.from_numpy`` makes host data too; on CUDA the host side
  must also be pinned, ``.pin_memory()``, for a copy not to wait: the code does both);
- copies to the host: ``.tolist()``, ``.numpy()``, ``.cpu()``, ``.to('cpu')`` (wrapped, since they do not
  dispatch on a CPU tensor). The code says which copy it means: a string ``'cpu'`` or ``.cpu()`` is a copy to
  the host, a ``torch.device`` (``opt.device``, ``x.device``) one to the device.

**Host data is not device data.** Labels and dataset ids come from the loader on the host, and work on them
there (class blocks, which ids repeat) waits for nothing. The tensors given to :meth:`SyncCounter.host` are
host data, and so is every result of an operator whose tensor inputs are all host data or made by a factory
(``arange``, ``full``; no tensor input); a factory called without ``device=`` (``torch.rand(n, generator=g)``) makes
host data, as it would on a GPU run. Only operators with an input that is device data are counted. On a
CPU ``.to(device)`` returns its input unchanged; while counting it returns a copy that is device data, as a
real copy to a GPU is.

Under ``torch.cuda.set_sync_debug_mode('error')`` a CUDA run raises at each real synchronization
(``tests/test_cuda.py``).
"""
import contextlib
import functools
import weakref
from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

aten = torch.ops.aten
# Modes (``helpers.method_modes`` names) whose definition reads device data back every step, by design and documented:
# what a step of theirs must wait for, on the CPU counter (``tests/training/test_sync.py``) and on CUDA
# (``tests/test_cuda.py``, which counts the waits under the sync debug mode) alike.
READS_BY_DESIGN = {
    # the authors' per-step assignment (losses_proto.TSCLoss, docs/FIELD.md): the cost matrix read back once
    'TSC --tsc_assign=step': {'Tensor.cpu': 1},
}
SYNCING = {aten._local_scalar_dense.default, aten.nonzero.default, aten.masked_select.default,
           aten.equal.default, aten.bincount.default,
           aten._unique.default, aten._unique2.default, aten.unique_dim.default, aten.unique_consecutive.default,
           aten.unique_dim_consecutive.default}
HOST_COPIES = ('tolist', 'numpy', 'cpu')
HOST_FACTORIES = ('rand', 'randn', 'randint', 'randperm', 'arange', 'empty', 'zeros', 'ones', 'full', 'linspace')


class _IdSet:
    """A set of tensors by identity that does not keep them alive (``WeakSet`` compares tensors with ``==``)."""

    def __init__(self):
        self._refs = {}

    def add(self, t):
        self._refs[id(t)] = weakref.ref(t)

    def discard(self, t):
        self._refs.pop(id(t), None)

    def __contains__(self, t):
        ref = self._refs.get(id(t))
        return ref is not None and ref() is t


def _bool_index(indices):
    return any(i is not None and i.dtype in (torch.bool, torch.uint8) for i in indices)


class SyncCounter(TorchDispatchMode):
    """``with SyncCounter() as c: c.host(labels, ids); ...`` then ``c.total`` and ``c.counts``
    (``{operator name: calls}``)."""

    def __init__(self):
        super().__init__()
        self.counts = Counter()
        self._host = _IdSet()
        self._made = _IdSet()                # made by a factory (no tensor input)
        self._saved = {}
        self._setitem_values = []            # per nested __setitem__: is its value host data (a Python number)?

    def host(self, *tensors):
        """Mark ``tensors`` as host data (a loader's labels and ids)."""
        for t in tensors:
            if isinstance(t, torch.Tensor):
                self._host.add(t)

    def _is_host_side(self, tensors):
        return bool(tensors) and all(t in self._host or t in self._made for t in tensors) and \
            any(t in self._host for t in tensors)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        inputs = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        host_side = self._is_host_side(inputs)
        name = None
        if func in SYNCING:
            name = func.overloadpacket.__name__
        elif func in (aten.index.Tensor, aten.index_put.default, aten.index_put_.default) and _bool_index(args[1]):
            name = f'{func.overloadpacket.__name__} (boolean mask)'
        elif func in (aten.index.Tensor, aten.index_put.default, aten.index_put_.default) and \
                args[0] not in self._host and args[0] not in self._made and \
                any(i is not None and i in self._host for i in args[1]):
            name = f'{func.overloadpacket.__name__} (host indices into device data)'
        elif func in (aten.index_put.default, aten.index_put_.default) and \
                args[0] not in self._host and args[0] not in self._made and \
                (args[2] in self._host or (self._setitem_values and self._setitem_values[-1])):
            name = f'{func.overloadpacket.__name__} (host value into device data)'
        elif func is aten.copy_.default and args[0] not in self._host and args[0] not in self._made and \
                args[1] in self._host and not (args[2] if len(args) > 2 else kwargs.get('non_blocking', False)):
            name = 'copy_ (host data into device data, blocking)'
        elif func is aten.repeat_interleave.Tensor and kwargs.get('output_size') is None:
            name = 'repeat_interleave (no output_size)'
        elif func is aten.histc.default and tuple(args[2:4]) in ((), (0, 0)) and not kwargs:
            name = 'histc (no range)'
        if name is not None and not host_side:
            self.counts[name] += 1
        out = func(*args, **kwargs)
        outputs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        for t in outputs:
            if host_side:
                self._host.add(t)
            elif not inputs:
                self._made.add(t)
        return out

    def __enter__(self):
        for method in HOST_COPIES:
            original = getattr(torch.Tensor, method)
            self._saved[method] = original

            def wrapped(t, *a, _original=original, _name=method, **k):
                if t not in self._host:
                    self.counts[f'Tensor.{_name}'] += 1
                out = _original(t, *a, **k)
                if isinstance(out, torch.Tensor):
                    if out is t and t not in self._host:     # a copy on a GPU: device data stays device data
                        out = t.clone()
                    self._host.add(out)
                return out
            setattr(torch.Tensor, method, wrapped)
        original_to = torch.Tensor.to
        self._saved['to'] = original_to

        def to(t, *a, **k):
            """``.to('cpu')`` (a string) is a copy to the host; ``.to(device)`` (a ``torch.device``) one to the
            device: the code says which it means, since on a CPU run both are the CPU."""
            out = original_to(t, *a, **k)
            targets = [x for x in (*a, k.get('device')) if isinstance(x, (torch.device, str))]
            if any(isinstance(x, str) and x == 'cpu' for x in targets):
                if t not in self._host:
                    self.counts['Tensor.to(cpu)'] += 1
                    if out is t:                             # a copy on a GPU: device data stays device data
                        out = t.clone()
                self._host.add(out)
            elif targets and t in self._host:     # a copy to the device: device data from here on
                if not k.get('non_blocking', False) and not any(isinstance(x, bool) and x for x in a):
                    self.counts['Tensor.to(device) (blocking copy)'] += 1
                if out is t:
                    out = t.clone()
                self._host.discard(out)
            return out
        torch.Tensor.to = to
        original_setitem = torch.Tensor.__setitem__
        self._saved['__setitem__'] = original_setitem

        def setitem(t, index, value):
            """``t[index] = value``: a Python number is host data (on CUDA a host scalar tensor that an index
            assignment copies to the device); a plain slice assignment of it is a fill and waits for nothing."""
            self._setitem_values.append(isinstance(value, (bool, int, float, complex)))
            try:
                return original_setitem(t, index, value)
            finally:
                self._setitem_values.pop()
        torch.Tensor.__setitem__ = setitem
        for factory in HOST_FACTORIES:
            original_factory = getattr(torch, factory)
            self._saved[f'torch.{factory}'] = original_factory

            def on_host(*a, _original=original_factory, **k):
                """A factory called without ``device=`` makes host data (the CPU's, wherever the run is)."""
                out = _original(*a, **k)
                if k.get('device') is None and isinstance(out, torch.Tensor):
                    self._host.add(out)
                return out
            setattr(torch, factory, on_host)
        for factory in ('tensor', 'as_tensor', 'from_numpy'):
            original_factory = getattr(torch, factory)
            self._saved[f'torch.{factory}'] = original_factory

            def made(data, *a, _original=original_factory, _name=factory, **k):
                """Python or NumPy data, or host tensors, made into a tensor: host data, or with a ``device=`` a
                blocking copy to the device."""
                out = _original(data, *a, **k)
                from_host = not isinstance(data, torch.Tensor) or data in self._host
                device = k.get('device')
                if from_host and device is not None and not (isinstance(device, str) and device == 'cpu'):
                    self.counts[f'torch.{_name}(device=...) (blocking copy)'] += 1
                    if out in self._host:
                        out = out.clone()
                    self._host.discard(out)
                elif from_host:
                    self._host.add(out)
                return out
            setattr(torch, factory, made)
        return super().__enter__()

    def __exit__(self, *exc):
        for method, original in self._saved.items():
            if method.startswith('torch.'):
                setattr(torch, method[len('torch.'):], original)
            else:
                setattr(torch.Tensor, method, original)
        return super().__exit__(*exc)

    @property
    def total(self):
        return sum(self.counts.values())


@contextlib.contextmanager
def accelerator_forms():
    """The forms the code takes on an accelerator where a CPU form differs, for the block: CARROT's quantile
    selection (``sync_free=True``) and positives (one masked pass), and the batched augmentation in one pass with
    every operation on every row."""
    import losses_carrot
    from data import augment
    real_quantiles, real_apply = losses_carrot.pair_quantiles, augment.BatchAugment.apply
    real_form = losses_carrot.default_form
    losses_carrot.pair_quantiles = functools.partial(real_quantiles, sync_free=True)
    losses_carrot.default_form = lambda device: 'masked'
    augment.BatchAugment.apply = lambda self, images, params: (
        real_apply(self, images, params) if self.kind == 'eval' else self._apply(images, params, sync_free=True))
    try:
        yield
    finally:
        losses_carrot.pair_quantiles, augment.BatchAugment.apply = real_quantiles, real_apply
        losses_carrot.default_form = real_form


class OperatorCounter(TorchDispatchMode):
    """``with OperatorCounter() as c: ...`` then ``c.kernels``: the operators dispatched in the block that would each
    launch a kernel on a GPU (views, ``detach`` and allocations without a fill are left out), by name in
    ``c.counts``. A step's count is its launch count to first order: on a GPU each costs some microseconds of host
    time whatever its size, which is what limited SupCon + CARROT on the H100 (docs/results.md, "On a GPU")."""
    FREE = {'empty', 'empty_strided', 'empty_like', 'detach', 'alias', 'lift_fresh', '_unsafe_view'}

    def __init__(self):
        super().__init__()
        self.counts = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if not func.is_view and name not in self.FREE:
            self.counts[name] += 1
        return func(*args, **(kwargs or {}))

    @property
    def kernels(self):
        return sum(self.counts.values())
