from gpu_train.environment import CONFIG_KEY
from remote import errors
from remote.tasks import ns  # (the fab tasks live in remote/)

# No tracebacks: an error that escapes a task is a message and an exit code. The tasks' Environment,
# built once here, reaches them through their Context (Environment.of(c)).
ns.configure({CONFIG_KEY: errors.install()})
