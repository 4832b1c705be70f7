"""gpu-train-agent: the on-host half of gpu-train. Standard library only; Python 3.8+.

The laptop builds this package into one zipapp (``bundle.payload``), sends it with each task and
runs one subcommand, which answers with one JSON document on stdout: one SSH round trip per task.
The shipped bootstrap keeps the zipapp at REMOTE_ROOT/bin/gpu-train-agent, where the job wrapper,
cron and systemd run it. Start reading at the contract with the laptop, which the zipapp carries
(gpu_train/contract.py: run states, job spec, records, settings and defaults; gpu_train/answers.py: every
answer's document, built through gpu_train/codec.py's ``answer``), then ``cli``.

    store      the run store: atomic JSON, the launch lock, runs' folders, settings
    procs      processes, GPUs, uptime, SSH sessions
    status     each run's effective state; `status` and `logs`
    launch     `launch`: code into place, the wrapper under screen
    wrap       `wrap`: one job's process, requirements, exit code
    lifecycle  `stop`, `resume`, `boot`, `shutdown`, `tick`, `configure`
    notify     the webhook (gpu-train:notify): run ends, preemptions, returns
    recovery_call  (laptop only: shipped to Cloud Run) a preempted VM back by itself: the Compute calls around
               the recovery's decisions (gpu_train/recovery.py, which the zipapp carries for lifecycle)
    cli        the command line
    bundle     (laptop only) the deterministic zipapp and the bootstrap that installs it
"""
