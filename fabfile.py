from remote import errors
from remote.tasks import ns  # noqa: F401  (the fab tasks live in remote/)

errors.install()  # no tracebacks: an error that escapes a task is a message and an exit code
