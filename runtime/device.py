"""The device of a process, mixed precision and memory layout (:class:`Runtime`), compilation, deterministic
kernels, and the allocator setting of the CPU augmentation."""
import functools
import os
from dataclasses import dataclass

import torch

from core.flags import Feature, UserError, check


# ---------------------------------------------------------------- devices, precision, memory layout
def resolve_device(name):
    if name == 'auto':
        return torch.device('cuda' if torch.cuda.is_available() else 'cpu')
    try:
        device = torch.device(name)
    except RuntimeError:
        raise UserError(f'unknown --device {name!r} (auto, cpu, cuda, cuda:N)') from None
    if device.type == 'cuda' and not torch.cuda.is_available():
        raise UserError(f'--device {name} asked for, but no CUDA device is available')
    if device.type == 'cuda' and device.index is not None and device.index >= torch.cuda.device_count():
        raise UserError(f'--device {name} asked for, but this machine has {torch.cuda.device_count()} CUDA device(s)')
    return device


def keep_freed_memory():
    """Have glibc keep freed memory for reuse instead of handing it back to the OS (a no-op elsewhere). By default
    glibc serves blocks over 128 KB from a fresh ``mmap`` (a threshold it may raise as blocks are freed, by an
    amount that varies between runs) and trims freed heap tops over 128 KB, so work that
    allocates such temporaries at every operation (the batched augmentation of ``--augment device`` on a CPU,
    a CPU training step) pays a page fault per 4 KB page at each use. Here blocks up to 32 MB come from the heap and
    up to 256 MB of freed heap stays mapped (docs/AUGMENT.md). Returns whether the setting took effect."""
    import ctypes
    import platform
    if platform.system() != 'Linux' or platform.libc_ver()[0] != 'glibc':
        return False
    try:
        libc = ctypes.CDLL('libc.so.6')
    except OSError:
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3
    return bool(libc.mallopt(m_mmap_threshold, 32 << 20)) and bool(libc.mallopt(m_trim_threshold, 256 << 20))


AMP_DTYPES = {'none': None, 'bf16': torch.bfloat16, 'fp16': torch.float16}


@dataclass(frozen=True)
class Runtime:
    """Where and how tensors are computed: the device, ``--amp`` (``'none'``, ``'bf16'``, ``'fp16'``),
    ``--channels_last`` and ``--deterministic``. Built from the options once (``flags.call_hook(Runtime, opt)``,
    after ``engine.setup`` resolved the device) and handed to the code that moves data or runs models."""
    device: torch.device
    amp: str = 'none'
    channels_last: bool = False
    deterministic: bool = False

    def autocast(self):
        """The autocast context for ``--amp``."""
        dtype = AMP_DTYPES[self.amp]
        return torch.autocast(device_type=self.device.type, dtype=dtype or torch.float32, enabled=dtype is not None)

    def grad_scaler(self) -> torch.amp.GradScaler:
        """A ``GradScaler``, enabled under ``--amp fp16`` only."""
        return torch.amp.GradScaler(self.device.type, enabled=self.amp == 'fp16')

    def prepare_model(self, model):
        """Move to the device (channels-last if asked); cuDNN autotuning on CUDA unless ``--deterministic``."""
        model = model.to(self.device)
        if self.channels_last:
            model = model.to(memory_format=torch.channels_last)
        if self.device.type == 'cuda':
            torch.backends.cudnn.benchmark = not self.deterministic
        return model

    def to_device(self, images: torch.Tensor) -> torch.Tensor:
        """``images`` on the device (asynchronously from pinned memory), channels-last if asked."""
        images = images.to(self.device, non_blocking=True)
        if self.channels_last and images.dim() == 4:
            images = images.contiguous(memory_format=torch.channels_last)
        return images


def device_type(device):
    """``'cuda'`` or ``'cpu'``: the kind of device ``--device`` (``auto``, ``cpu``, ``cuda``, ``cuda:N``) names on
    this machine, without touching it (``resolve_device`` checks it later, in ``engine.setup``)."""
    name = str(device)
    if name == 'auto':
        return 'cuda' if torch.cuda.is_available() else 'cpu'
    return 'cuda' if name.startswith('cuda') else 'cpu'


def on_off_auto(text):
    """``--channels_last``'s type: ``auto``, or on/off (``on``, ``off``, ``true``, ``false``, ``1``, ``0``)."""
    value = str(text).strip().lower()
    if value == 'auto':
        return 'auto'
    if value in ('on', 'true', '1', 'yes'):
        return True
    if value in ('off', 'false', '0', 'no'):
        return False
    import argparse
    raise argparse.ArgumentTypeError(f'expected auto, on or off, got {text!r}')


def bf16_autocast_fast(device):
    """Whether the CUDA device has bfloat16 tensor cores (compute capability 8.0 and later: A100, H100, ...); older
    ones emulate bf16 slowly."""
    index = torch.device(device).index if str(device).startswith('cuda:') else int(os.environ.get('LOCAL_RANK', 0))
    return torch.cuda.get_device_capability(index) >= (8, 0)


def resolve_precision(amp, channels_last, device):
    """``--amp auto`` and ``--channels_last auto``: on CUDA the fast path (bf16 autocast where the GPU has bf16 tensor
    cores, channels-last), elsewhere SupContrast's (float32, contiguous): on a CPU exactly the values of ``none`` and
    off, so a CPU run is bit-equal to one that gives them. A value given is kept."""
    cuda = device_type(device) == 'cuda'
    if cuda:
        resolve_device(device)      # a CUDA device that is not there: one line before its capability is asked
    out = {}
    if amp == 'auto':
        out['amp'] = 'bf16' if cuda and bf16_autocast_fast(device) else 'none'
    if channels_last == 'auto':
        out['channels_last'] = cuda
    return out


PRECISION = Feature(
    'precision and memory layout', where_it_ran=('amp', 'channels_last'), check=resolve_precision,
    flags={'--amp': dict(choices=['auto', *AMP_DTYPES], default='auto',
                         help='mixed precision autocast (losses still compute in float32); auto: bf16 on a CUDA GPU '
                              'with bf16 tensor cores, none elsewhere'),
           '--channels_last': dict(type=on_off_auto, nargs='?', const=True, default='auto',
                                   help='channels-last memory format: on (the flag alone), off, or auto (on on CUDA, '
                                        'off elsewhere)')},
    run_name=lambda amp: f'_{amp}' if amp != 'none' else '')


def describe_path(device, augment, amp, channels_last, compile=False):
    """The run's first line about its speed path: where it runs and how (the values ``auto`` resolved to)."""
    line = (f'path: {device}, --augment {augment}, --amp {amp}, --channels_last {"on" if channels_last else "off"}'
            + (', --compile' if compile else ''))
    if torch.device(device).type == 'cuda' and (augment, amp, channels_last) == ('device', 'bf16', True):
        line += ' (the GPU defaults; SupContrast\'s path: --augment cpu --amp none --channels_last off)'
    return line


_compiled = False              # whether this process compiled modules (keep_compiled_shapes acts only then)


@dataclass(frozen=True)
class Compiler:
    """``--compile``, ``--compile_backend`` and ``--compile_mode``: how a trainer compiles its modules and its step.
    Built from the options once (``flags.call_hook(Compiler, opt)``). The compiler's stance is the default until the
    first training step has compiled its graphs (:func:`keep_compiled_shapes`)."""
    compile: bool = False
    compile_backend: str = 'inductor'
    compile_mode: str = 'default'

    def _start(self):
        global _compiled
        torch.compiler.set_stance('default')
        _compiled = True
        return dict(backend=self.compile_backend, mode=None if self.compile_mode == 'default' else self.compile_mode)

    def modules(self, *modules):
        """``torch.compile`` each module in place (``nn.Module.compile``: its parameter names, and so the
        checkpoints, stay those of the plain module, which load with or without the flag). Called once a module's
        copies are made (the key encoder is a copy of the uncompiled model)."""
        if self.compile:
            kwargs = self._start()
            for module in modules:
                module.compile(**kwargs)

    def function(self, fn, enabled=True, trace_grad=False):
        """``torch.compile(fn)`` (a step's forward and loss: its backward compiled with it; the compiled function is
        the result's ``compiled``), or ``fn`` itself without ``--compile`` or when not ``enabled``. ``trace_grad``:
        ``fn`` takes gradients itself (``torch.autograd.grad``: CARROT's balance), which the compiler then traces into
        the graph (:func:`traces_grad`). A step's graph is the largest the run compiles: where the compiler fails on
        it (a torch release that cannot trace one of its parts), that part runs eagerly, with the compiler's warning,
        instead of ending the run (``suppress_errors``)."""
        if not (self.compile and enabled):
            return fn
        compiled = torch.compile(fn, **self._start())
        settings = dict(suppress_errors=True, **({'trace_autograd_ops': True} if trace_grad else {}))

        @functools.wraps(fn)
        def step(*args, **kwargs):
            with torch._dynamo.config.patch(**settings):
                return compiled(*args, **kwargs)
        step.compiled = compiled
        return step


def traces_grad():
    """Whether this torch's compiler traces ``torch.autograd.grad`` into a graph (``torch._dynamo.config.
    trace_autograd_ops``, torch 2.11 and later): then CARROT's balance is part of the compiled step."""
    return hasattr(torch._dynamo.config, 'trace_autograd_ops')


def dynamic_sizes(plan):
    """Mark every size of the tensors in ``plan`` (a tensor, or an iterable of them and of such iterables: a loss's
    host plan; anything else skipped) dynamic for the compiler (``torch._dynamo.maybe_mark_dynamic``): a compiled
    graph then takes other sizes without compiling again (class blocks differ from batch to batch). Nothing happens
    outside a compiled call."""
    if isinstance(plan, torch.Tensor):
        for dim in range(plan.dim()):
            torch._dynamo.maybe_mark_dynamic(plan, dim)
    elif hasattr(plan, '__iter__') and not isinstance(plan, (str, bytes, dict)):
        for part in plan:
            dynamic_sizes(part)


def keep_compiled_shapes():
    """After the first training step of a compiled run: a call the compiled graphs do not fit (an epoch's last,
    smaller batch; an evaluation in eval mode or with another batch size) runs eagerly instead of compiling again
    (``torch.compiler.set_stance('eager_on_recompile')``). A recompile of a ResNet-50 costs a minute or more on a
    GPU (docs/results.md, "The second GPU check") to speed up one step in an epoch's 49; the first step's graphs,
    which every full batch uses, stay compiled. Nothing without ``--compile``."""
    if _compiled:
        torch.compiler.set_stance('eager_on_recompile')


COMPILE_MODES = ('default', 'reduce-overhead', 'max-autotune', 'max-autotune-no-cudagraphs')


def _check_compile(compile, compile_backend, compile_mode, given):
    check(compile != 'auto', '--compile takes on or off, not auto')
    check(compile_mode == 'default' or compile_backend == 'inductor',
          f'--compile_mode {compile_mode} is an inductor mode: leave --compile_backend {compile_backend} out')
    check(compile or 'compile_mode' not in given or 'compile' in given, '--compile_mode needs --compile')
    if compile_backend != 'inductor':          # (listing the backends imports the compiler: only when asked)
        backends = torch.compiler.list_backends(exclude_tags=())
        check(compile_backend in backends, f'--compile_backend {compile_backend} is not a torch.compile backend: '
                                           'inductor, aot_eager or eager (torch.compiler.list_backends(exclude_tags='
                                           '()) lists them all)')
    # (a --compile off given with it turns the compiler off: a run started with a backend resumes uncompiled)
    check(compile or 'compile_backend' not in given or 'compile' in given, '--compile_backend needs --compile')


COMPILE = Feature(
    'torch.compile', scripts=('supcon', 'ce'), resume_may_change=('compile', 'compile_backend', 'compile_mode'),
    flags={'--compile': dict(type=on_off_auto, nargs='?', const=True, default=False,
                             help='torch.compile the encoder and heads, and where the loss traces whole the step\'s '
                                  'forward as one graph (augmentation, model, loss), with a fused optimizer update: on '
                                  '(the flag alone) or off (the first steps compile; checkpoints load with or without '
                                  'it; the CIFAR recipes turn it on, --compile off turns it off again)'),
           '--compile_backend': dict(type=str, default='inductor',
                                     help="torch.compile's backend: inductor (generates kernels), or aot_eager / "
                                          'eager (the same graphs without code generation: to tell a compiler '
                                          'problem from a model one, and compile in seconds on a CPU)'),
           '--compile_mode': dict(choices=COMPILE_MODES, default='default',
                                  help="inductor's mode: default; reduce-overhead (CUDA graphs: each compiled graph "
                                       'replayed as one launch; for steps of fixed shapes, docs/USAGE.md); '
                                       'max-autotune (also tunes its kernels; compiles for longer)')},
    check=_check_compile)


def set_deterministic(enabled):
    """``--deterministic``: deterministic algorithms everywhere (``torch.use_deterministic_algorithms``; an
    operation without one raises), cuDNN deterministic and not autotuned, cuBLAS with a fixed workspace (set
    before the first CUDA call). The project's own code has no atomic reduction in any case (docs/USAGE.md,
    "Reproducibility"); this covers the libraries'."""
    if not enabled:
        return
    os.environ.setdefault('CUBLAS_WORKSPACE_CONFIG', ':4096:8')
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False


REPRODUCIBILITY = Feature(
    'reproducibility', resume_may_change=('deterministic',),
    flags={'--deterministic': dict(action='store_true',
                                   help='bit-for-bit reproducible runs and resumes on CUDA too (deterministic '
                                        'kernels, no cuDNN autotuning; slower): docs/USAGE.md, "Reproducibility"')})
