from remote.tasks import ns  # noqa: F401  (the fab tasks live in remote/)
