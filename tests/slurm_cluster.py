"""A one-node SLURM cluster on this machine for the sweep tests: Debian's ``munged``, ``slurmctld`` and ``slurmd``
with a configuration of their own in a scratch folder (their own munge socket and key, free ports, no accounting
database), started by :func:`start` and stopped, every daemon it started, by :func:`stop`.

``.ci/run`` installs the packages when they are absent (``apt-get install slurmctld slurmd slurm-client munge``); the
daemons need root (slurmd starts jobs as their users). Without either, :func:`unavailable` says why and the tests skip.
"""
import os
import shutil
import socket
import subprocess
import time

DAEMONS = ('munged', 'slurmctld', 'slurmd', 'sbatch', 'squeue', 'scontrol', 'scancel')


def unavailable():
    """Why no cluster can be started here, or ``None``."""
    missing = [d for d in DAEMONS if shutil.which(d) is None and not os.path.exists(f'/usr/sbin/{d}')]
    if missing:
        return f'SLURM is not installed ({", ".join(missing)} missing; .ci/run installs it)'
    if os.geteuid() != 0:
        return 'slurmd needs root to start jobs'
    return None


def _free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def _binary(name):
    return shutil.which(name) or f'/usr/sbin/{name}'


class Cluster:
    """A started cluster: ``env`` is what a client needs (``SLURM_CONF``)."""

    def __init__(self, folder):
        self.folder = folder
        self.conf = os.path.join(folder, 'slurm.conf')
        self.env = {**os.environ, 'SLURM_CONF': self.conf}
        self.pids = {}

    def run(self, *args, check=True):
        return subprocess.run(list(args), env=self.env, capture_output=True, text=True, timeout=60, check=check)


def start(folder):
    """Start munged, slurmctld and slurmd in ``folder``; returns the :class:`Cluster` once its node is idle."""
    os.makedirs(folder, exist_ok=True)
    cluster = Cluster(folder)
    for sub in ('state', 'spool', 'munge'):
        os.makedirs(os.path.join(folder, sub), exist_ok=True)
    munge = os.path.join(folder, 'munge')
    key = os.path.join(munge, 'munge.key')
    with open(key, 'wb') as f:
        f.write(os.urandom(1024))
    os.chmod(key, 0o600)
    socket_path = os.path.join(munge, 'sock')
    subprocess.run([_binary('munged'), '--force', '-S', socket_path, f'--key-file={key}',
                    f'--log-file={munge}/log', f'--pid-file={munge}/pid', f'--seed-file={munge}/seed'],
                   check=True, capture_output=True, timeout=30)
    host = socket.gethostname()
    cpus = os.cpu_count() or 1
    memory = int(os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2 ** 20 * 0.8)
    with open(cluster.conf, 'w') as f:
        f.write(f'''ClusterName=sweeptest
SlurmctldHost={host}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={socket_path}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd.pid
SlurmctldLogFile={folder}/slurmctld.log
SlurmdLogFile={folder}/slurmd.log
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
ReturnToService=2
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
KillWait=5
NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={memory} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
''')
    try:
        subprocess.run([_binary('slurmctld'), '-c', '-f', cluster.conf], env=cluster.env, check=True,
                       capture_output=True, timeout=30)
        subprocess.run([_binary('slurmd'), '-f', cluster.conf], env=cluster.env, check=True, capture_output=True,
                       timeout=30)
        deadline = time.time() + 60
        while time.time() < deadline:
            out = cluster.run('sinfo', '-h', '-o', '%t', check=False)
            if out.stdout.strip() == 'idle':
                return cluster
            time.sleep(0.5)
        raise RuntimeError(f'the SLURM node did not become idle: {out.stdout} {out.stderr} {tail(folder)}')
    except BaseException:
        stop(cluster)
        raise


def tail(folder):
    text = ''
    for name in ('slurmctld.log', 'slurmd.log'):
        try:
            with open(os.path.join(folder, name)) as f:
                text += f'\n{name}: ' + ' | '.join(f.read().splitlines()[-5:])
        except OSError:
            pass
    return text


def _pid(path):
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def stop(cluster):
    """Cancel every job, stop slurmd, slurmctld and munged, and wait until they are gone."""
    cluster.run('scancel', '--full', '-u', 'root', check=False)
    cluster.run('scontrol', 'shutdown', check=False)
    pids = [_pid(os.path.join(cluster.folder, name)) for name in ('slurmd.pid', 'slurmctld.pid', 'munge/pid')]
    deadline = time.time() + 20
    for pid in pids:
        if pid is None:
            continue
        while time.time() < deadline and _alive(pid):
            if os.path.basename(_cmdline(pid)).startswith('munged'):
                os.kill(pid, 15)
            time.sleep(0.2)
        if _alive(pid):
            os.kill(pid, 9)


def _cmdline(pid):
    try:
        with open(f'/proc/{pid}/cmdline', 'rb') as f:
            return f.read().split(b'\0')[0].decode()
    except OSError:
        return ''


def _alive(pid):
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:
        with open(f'/proc/{pid}/stat') as f:
            return f.read().split()[2] != 'Z'        # a zombie is gone for our purposes
    except OSError:
        return False
