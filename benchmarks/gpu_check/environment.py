"""1. The environment: GPU, memory, driver, versions, commit, date."""
import datetime
import os
import platform
import subprocess

from benchmarks.gpu_check.common import ROOT, outcome


def commit():
    if os.environ.get('GPU_CHECK_COMMIT'):
        return os.environ['GPU_CHECK_COMMIT']
    try:
        head = subprocess.run(['git', 'rev-parse', '--short', 'HEAD'], cwd=ROOT, capture_output=True, text=True,
                              timeout=10)
        dirty = subprocess.run(['git', 'status', '--porcelain', '--untracked-files=no'], cwd=ROOT,
                               capture_output=True, text=True, timeout=10)
        if head.returncode == 0:
            return head.stdout.strip() + (' (with uncommitted changes)' if dirty.stdout.strip() else '')
    except (OSError, subprocess.TimeoutExpired):
        pass
    return 'unknown (no .git here: run with GPU_CHECK_COMMIT=<commit>)'


def section_environment(ctx):
    import numpy
    import torch
    import torchvision
    try:
        import timm
        timm_version = timm.__version__
    except ImportError:
        timm_version = 'not installed'
    env = {'date': datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC'), 'commit': commit(),
           'python': platform.python_version(), 'torch': torch.__version__, 'torchvision': torchvision.__version__,
           'timm': timm_version, 'numpy': numpy.__version__, 'cpu_cores': os.cpu_count(),
           'cuda_runtime': torch.version.cuda, 'cudnn': torch.backends.cudnn.version() if ctx.cuda else None}
    if ctx.cuda:
        props = torch.cuda.get_device_properties(0)
        env.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2 ** 30, 1),
                   multiprocessors=props.multi_processor_count, capability=f'{props.major}.{props.minor}')
        try:
            smi = subprocess.run(['nvidia-smi', '--query-gpu=driver_version', '--format=csv,noheader'],
                                 capture_output=True, text=True, timeout=20)
            env['driver'] = smi.stdout.strip() or smi.stderr.strip()
        except (OSError, subprocess.TimeoutExpired) as e:
            env['driver'] = f'nvidia-smi failed: {e}'
    else:
        env['gpu'] = 'no CUDA device'
    rows = ['| | |', '| --- | --- |'] + [f'| {k} | {v} |' for k, v in env.items()]
    return outcome(ctx, True, '\n'.join(rows), env, needs_cuda=False)
