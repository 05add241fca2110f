"""Where a server listens: the check that keeps a server without an API key on loopback, the socket it
binds, and the URL it prints. Plain sockets: nothing here needs the serve extra."""

from __future__ import annotations

import importlib.util
import ipaddress
import socket

from pocketspec.errors import UserError
from pocketspec.serve.serve_settings import API_KEY_VARIABLE, LOOPBACK_HOST

SERVE_PACKAGES = ("fastapi", "uvicorn", "prometheus_client")


def require_serve_packages() -> None:
    """UserError naming the extra to install when the server's packages are missing."""
    missing = [name for name in SERVE_PACKAGES if importlib.util.find_spec(name) is None]
    if missing:
        raise UserError(f"pocketspec serve needs {', '.join(missing)}: pip install 'pocketspec[serve]' "
                        "(`make setup` installs it)")


def is_loopback(host: str) -> bool:
    """Whether every address `host` names is a loopback one (127.0.0.0/8, ::1, localhost)."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)}
    except OSError:
        return False
    return bool(addresses) and all(ipaddress.ip_address(address.split("%")[0]).is_loopback for address in addresses)


def check_exposure(host: str, api_key: str | None) -> None:
    """Without an API key, only this machine may reach the server. A key with spaces around it (or of spaces
    alone) is refused: HTTP strips them from the header, so no client could send it ("" means no key)."""
    if api_key and api_key.strip() != api_key:
        raise UserError(f"--api-key (or {API_KEY_VARIABLE}) has spaces around it or is blank: no client could send "
                        "it, since HTTP strips them from the Authorization header; give the key alone")
    if not api_key and not is_loopback(host):
        raise UserError(f"--host {host} is not a loopback address: without an API key pocketspec serve binds to "
                        f"loopback only; set --api-key (or {API_KEY_VARIABLE}) or use --host {LOOPBACK_HOST}")


def bind_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port (0: a free port), not yet listening; UserError when it cannot be had."""
    try:
        family, kind, protocol, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, protocol)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as error:
        raise UserError(f"cannot listen on {host}:{port} ({error.strerror or error}); pick another --port "
                        "(0: any free one) or --host") from None
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
