"""runtime/device.py: the allocator setting, and the fast path by default on a GPU (--augment, --amp, ...)."""
import platform
import subprocess
import sys

import pytest
import torch

from helpers import ROOT, script_env

FAULTS = """
import resource, sys, torch
from runtime import device as runtime
torch.set_num_threads(1)      # one thread frees in one order (two made the plain count vary from 6e3 to 3e5)
if sys.argv[1] == 'keep':
    assert runtime.keep_freed_memory()
x = torch.ones(384 * 1024)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(400):
    (x * 2 + 1) * 3 - x                   # temporaries of 1.5 MB, several alive at once
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@pytest.mark.skipif(platform.system() != 'Linux' or platform.libc_ver()[0] != 'glibc', reason='glibc only')
def test_keep_freed_memory_spares_the_page_faults():
    """With glibc's mmap threshold at its default 128 KB, temporaries of 1.5 MB are handed back to the OS and
    faulted in again at every use (about 600,000 page faults here); with runtime.keep_freed_memory they are reused.
    The threshold is set explicitly (MALLOC_MMAP_THRESHOLD_): left alone, glibc may raise it after the first
    freed block, and how many faults that saves varied from run to run (3,000 to 10,000 here)."""
    def faults(mode):
        out = subprocess.run([sys.executable, '-c', FAULTS, mode], cwd=ROOT, capture_output=True, text=True,
                             check=True, env=script_env(MALLOC_MMAP_THRESHOLD_=str(128 * 1024))).stdout
        return int(out.split()[-1])
    plain, kept = faults('plain'), faults('keep')
    assert kept * 5 < plain, (kept, plain)


# ---------------------------------------------------------------- the fast path by default on a GPU
FAST = ['--augment', 'device', '--amp', 'bf16', '--channels_last']
SUPCONTRAST = ['--augment', 'cpu', '--amp', 'none', '--channels_last', 'off']


def _same_run(a, b):
    """Two parses define the same run: every option but the record of the flags given."""
    a, b = dict(vars(a)), dict(vars(b))
    a.pop('given_flags'), b.pop('given_flags')
    return a == b


@pytest.fixture
def a_gpu(monkeypatch):
    """This process sees a CUDA GPU with bf16 tensor cores (capability 9.0): what ``auto`` reads; nothing is run."""
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)
    monkeypatch.setattr(torch.cuda, 'get_device_capability', lambda index=None: (9, 0))


@pytest.mark.parametrize('script', ['supcon', 'ce'])
def test_auto_resolves_on_a_cpu_to_supcontrasts_path_exactly(script):
    """On a CPU the defaults are today's values: a run with them is the run with ``--augment cpu --amp none
    --channels_last off`` (every option and the run's name equal, so its result is bit-equal)."""
    from config.options import parse_option
    auto = parse_option(script, ['--device', 'auto'])
    assert (auto.augment, auto.amp, auto.channels_last) == ('cpu', 'none', False)
    assert _same_run(auto, parse_option(script, ['--device', 'auto', *SUPCONTRAST]))


@pytest.mark.parametrize('script', ['supcon', 'ce'])
def test_auto_resolves_on_a_gpu_to_the_fast_path(script, a_gpu, monkeypatch):
    from config.options import parse_option
    auto = parse_option(script, [])
    assert (auto.augment, auto.amp, auto.channels_last) == ('device', 'bf16', True)
    assert _same_run(auto, parse_option(script, FAST)) and auto.run_name.endswith('_bf16_devaug')
    given = parse_option(script, SUPCONTRAST)                     # SupContrast's path back, as given
    assert (given.augment, given.amp, given.channels_last) == ('cpu', 'none', False)
    cpu = parse_option(script, ['--device', 'cpu'])               # --device cpu on a GPU machine: today's values
    assert (cpu.augment, cpu.amp, cpu.channels_last) == ('cpu', 'none', False)
    monkeypatch.setattr(torch.cuda, 'get_device_capability', lambda index=None: (7, 0))
    assert parse_option(script, []).amp == 'none'                 # a V100: no bf16 tensor cores
    assert parse_option(script, ['--randaugment', '2,9']).augment == 'cpu'     # RandAugment: the PIL pipeline


def test_auto_augments_on_the_cpu_where_the_device_cannot(a_gpu, tmp_path):
    """A dataset read from image files (without ``--image_cache``) has no device augmentation: ``auto`` takes the
    PIL pipeline instead of refusing, while ``--augment device`` given is still refused in one line."""
    from config.options import parse_option
    from core.flags import UserError
    folder = ['--dataset', 'path', '--data_folder', str(tmp_path), '--mean', '0.5', '--std', '0.25']
    assert parse_option('supcon', folder).augment == 'cpu'
    assert parse_option('supcon', [*folder, '--image_cache', '32']).augment == 'device'
    with pytest.raises(UserError, match='--augment device needs a dataset held in memory'):
        parse_option('supcon', [*folder, '--augment', 'device'])


def test_channels_last_takes_on_off_and_the_flag_alone(tmp_path):
    from config.options import parse_option
    assert parse_option('supcon', ['--channels_last']).channels_last is True
    assert parse_option('supcon', ['--channels_last', 'off']).channels_last is False
    assert parse_option('supcon', ['--channels_last', 'on', '--device', 'cpu']).channels_last is True
    recipe = tmp_path / 'r.yaml'
    recipe.write_text('channels_last: true\namp: bf16\n')
    opt = parse_option('supcon', ['--config', str(recipe)])
    assert (opt.channels_last, opt.amp) == (True, 'bf16')


def test_the_first_line_names_the_path():
    from runtime.device import describe_path
    assert describe_path(torch.device('cpu'), 'cpu', 'none', False) == \
        'path: cpu, --augment cpu, --amp none, --channels_last off'
    line = describe_path(torch.device('cuda'), 'device', 'bf16', True, compile=True)
    assert line.startswith('path: cuda, --augment device, --amp bf16, --channels_last on, --compile')
    assert "SupContrast's path: --augment cpu --amp none --channels_last off" in line


@pytest.mark.parametrize('name', ['resnet_nano', 'resnet_tiny'])
def test_the_compiled_modules_are_one_graph_each(name):
    """``--compile`` compiles the encoder and the projection head (``Compiler.modules``): each traces to one graph
    with no graph break (``torch._dynamo.explain``, on the CPU), so a change that adds a break fails here. Power
    check: a forward that reads a value on the host to branch breaks the graph."""
    from networks import SupConResNet
    model = SupConResNet(name)
    inputs = ((model.encoder, torch.randn(4, 3, 8, 8)), (model.head, torch.randn(4, model.encoder.feature_dim)))
    torch._dynamo.reset()
    for module, x in inputs:
        explained = torch._dynamo.explain(module)(x)
        assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons

    class ReadsTheHost(torch.nn.Module):
        def forward(self, x):
            return x * 2 if x.sum().item() > 0 else x
    assert torch._dynamo.explain(ReadsTheHost())(torch.ones(3)).graph_break_count >= 1


def test_the_compiler_passes_its_backend_and_mode(monkeypatch):
    """``Compiler`` (``--compile``, ``--compile_backend``, ``--compile_mode``): modules and functions get the backend
    and inductor's mode (``default`` is torch's own: no mode); without ``--compile`` nothing is compiled."""
    from runtime import device
    calls = []
    monkeypatch.setattr(device.torch, 'compile', lambda fn, **kw: calls.append(kw) or fn)
    monkeypatch.setattr(torch.nn.Module, 'compile', lambda self, **kw: calls.append(kw))
    monkeypatch.setattr(device, '_compiled', False)
    device.Compiler(False).modules(torch.nn.Linear(2, 2))
    assert device.Compiler(False).function(len) is len and not calls
    device.Compiler(True, 'inductor', 'reduce-overhead').modules(torch.nn.Linear(2, 2))
    device.Compiler(True, 'inductor', 'default').function(len)
    assert device.Compiler(True).function(len, enabled=False) is len
    assert calls == [dict(backend='inductor', mode='reduce-overhead'), dict(backend='inductor', mode=None)]
    torch.compiler.set_stance('default')


def test_a_compiler_failure_on_the_step_runs_it_eagerly(caplog):
    """A step's function whose compilation fails (here a backend that raises, as a torch release that cannot trace a
    part would) runs eagerly with the same result and the compiler's warning, instead of ending the run. Power: the
    same function compiled without the wrapper raises."""
    from runtime import device

    def failing(gm, example_inputs):
        raise RuntimeError('this backend cannot compile it')

    def fn(x):
        return (x * 2).sum()
    x = torch.arange(4.0)
    torch._dynamo.reset()
    try:
        step = device.Compiler(True, failing).function(fn)
        assert step(x) == fn(x) and hasattr(step, 'compiled')
        torch._dynamo.reset()
        with pytest.raises(Exception, match='cannot compile'):
            torch.compile(fn, backend=failing)(x)
    finally:
        torch._dynamo.reset()
        torch.compiler.set_stance('default')
