"""One SSH endpoint (``SshHost``): what a stack's ``hosts`` entry is parsed into and what remote/ssh
resolves and connects to. Apart from the settings, as everything that reaches a host uses it."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class SshHost:
    """One SSH endpoint. As parsed from a stack, ``spec`` keeps the text; once resolved through the
    ssh_config (remote/ssh/config.py), ``host`` is the real address, ``keys`` the identity files to
    offer and ``jump`` the ProxyJump hops in order."""

    user: str
    host: str
    port: int = 22
    spec: str = field(default="", compare=False)
    keys: tuple[str, ...] = ()
    jump: tuple[SshHost, ...] = ()

    def __str__(self) -> str:
        return f"{self.user}@{self.host}:{self.port}"
