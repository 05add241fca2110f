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
    """Whether every address `host` names is a loopback one (127.0.0.0/8, ::1, localhost); UserError for a name
    that does not resolve."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    addresses = {info[4][0] for info in _address_info(host, None)}
    return bool(addresses) and all(ipaddress.ip_address(address.split("%")[0]).is_loopback for address in addresses)


def _address_info(host: str, port: int | None) -> list[tuple]:
    """socket.getaddrinfo for a TCP socket; UserError naming --host where the name does not resolve."""
    try:
        return socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as error:  # UnicodeError: a label past 63 characters (idna)
        reason = error.strerror if isinstance(error, socket.gaierror) else "not a host name"
        raise UserError(f"--host {host!r} does not resolve ({reason}); give an address, such as {LOOPBACK_HOST} or "
                        "0.0.0.0 (IPv6 without brackets), or a name this machine resolves") from None


def check_exposure(host: str, api_key: str | None) -> None:
    """Without an API key, only this machine may reach the server. A key no client could send is refused ("" means
    no key): one with spaces around it (or of spaces alone), which HTTP strips from the header, and one with a
    character other than printable ASCII, which HTTP clients (the openai package's httpx) refuse to put in one."""
    if api_key and api_key.strip() != api_key:
        raise UserError(f"--api-key (or {API_KEY_VARIABLE}) has spaces around it or is blank: no client could send "
                        "it, since HTTP strips them from the Authorization header; give the key alone")
    if api_key and not (api_key.isascii() and api_key.isprintable()):
        position = next(index for index, char in enumerate(api_key, 1) if not (char.isascii() and char.isprintable()))
        raise UserError(f"--api-key (or {API_KEY_VARIABLE}): character {position} is not printable ASCII, so no "
                        "client could send the key, since an Authorization header carries printable ASCII only; use "
                        "letters, digits and punctuation")
    if not api_key and not is_loopback(host):
        raise UserError(f"--host {host} is not a loopback address: without an API key pocketspec serve binds to "
                        f"loopback only; set --api-key (or {API_KEY_VARIABLE}) or use --host {LOOPBACK_HOST}")


def bind_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port (0: a free port), not yet listening; UserError when it cannot be had."""
    family, kind, protocol, _, address = _address_info(host, port)[0]
    try:
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
