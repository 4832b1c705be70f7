"""The fab tasks: train, logs, status, stop, resume, fetch, down, setup, ssh, nvidia-smi; gpus, check, ls,
vm-stop, vm-start, ssh-config, stack, tensorboard, jupyter, tunnel.

Each task resolves the stack's target, opens one SSH connection per node (``session``), and does
its remote work in one agent call (plus rsync for bulk data). Start reading at ``train``.

    session     connections to a stack's nodes; fan-out where any exception is that node's failure
    render      status tables and messages (pure)
    localstate  what the laptop keeps: atomic writes, pushed manifests, fetch records
    train       train
    runlogs     logs
    runs        status, stop, resume, prune
    fetch       fetch
    teardown    down, and the guards before destroying (vm-stop's too)
    shell       setup, ssh, nvidia-smi
    overview    gpus (the catalog), stack, check, ls, ssh-config
    power       vm-stop, vm-start
    dashboards  tensorboard, jupyter, tunnel
    board       dashboard, report (every stack and run on one page: remote/dashboard/)
    importing   import (an AI Platform or Vertex AI job into a stack)
    data        push (a data directory to the host's DATA_DIR); remote/tasks/starter.py: init
    sweep       sweep (trials over GPU slots: start, status, best, stop)
"""

import functools
from collections.abc import Callable
from typing import Any

from invoke import Collection

from gpu_train.errors import GpuTrainError
from remote.errors import exit_for
from remote.tasks import board, dashboards, data, importing, overview, power, runlogs, runs, shell, sweep, teardown
from remote.tasks import fetch as fetching
from remote.tasks import train as training
from remote.tasks.shortflags import pin_short_flags
from remote.tasks.starter import init

ns = Collection(
    training.train,
    runlogs.logs,
    runs.status,
    runs.stop,
    runs.resume,
    runs.prune,
    fetching.fetch,
    teardown.down,
    shell.setup,
    shell.shell,
    shell.nvidia_smi,
    dashboards.tunnel,
    dashboards.tensorboard,
    dashboards.jupyter,
    board.dashboard,
    board.report,
    overview.gpus,
    overview.stack,
    overview.check,
    overview.ls_,
    overview.ssh_config,
    power.vm_stop,
    power.vm_start,
    importing.import_job,
    init,
    data.push,
    sweep.sweep_,
)


def _exits(body: Callable[..., Any]) -> Callable[..., Any]:
    """``body`` whose errors become Invoke's Exit here, once (``exit_for``: the status and the message
    ``outcome`` maps them to, control characters written out); the tasks raise, they never exit."""

    @functools.wraps(body)  # (Invoke reads the task's options from the wrapped signature)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return body(*args, **kwargs)
        except GpuTrainError as e:
            raise exit_for(e) from None

    return wrapper


for _task in ns.tasks.values():
    _task.body = _exits(_task.body)
    pin_short_flags(_task)
