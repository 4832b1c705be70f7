"""The HTTP server every stand-in of the tests serves from (Google's APIs, webhooks, a package index,
the metadata server, a cross-site page): http.server's, bound without asking DNS for its address's name.

``HTTPServer.server_bind`` calls ``socket.getfqdn(address)``: for a loopback address that /etc/hosts does
not name (127.0.15.1, 127.0.22.1, ...) that is a reverse lookup sent to the resolver, which on a machine
whose resolver does not answer waits out its 5 s timeout (here about one lookup in 50: a fast-tier
test's setup took 5.0 s that way, several times a run). The name is only CGI's SERVER_NAME; the address
stands in for it.
"""

from __future__ import annotations

import socketserver
from http.server import ThreadingHTTPServer


class LoopbackServer(ThreadingHTTPServer):
    def server_bind(self) -> None:
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = str(host), int(port)
