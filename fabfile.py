import fabric.main

from gpu_train.environment import CONFIG_KEY
from remote import errors
from remote.fab import adopt
from remote.tasks import ns  # (the fab tasks live in remote/)

# No tracebacks: an error that escapes a task is a message and an exit code. The tasks' Environment,
# built once here, reaches them through their Context (Environment.of(c)).
ns.configure({CONFIG_KEY: errors.install()})
# The task part of the command line, not parsed yet, is parsed as `gpu-train` parses it (remote/cli.py TaskLine):
# `train x.py --help` is train's help, a script's flag after `train` names --args, a typo gets "did you mean".
adopt(fabric.main.program)
