"""TLS in the server (``--tls-cert``, ``--tls-key``): HTTPS and WSS on the server's one port, for a single box with
no load balancer in front (one that terminates TLS stays the recommended setup, docs/deploy.md).

``ServerCertificate`` owns the one ``ssl.SSLContext`` the listener hands every new connection. A renewed pair
(certbot, cert-manager) is taken without a restart: on SIGHUP and when either file's modification time changes
(looked at every ``--tls-poll-s``), the pair is first checked on a fresh context and only then loaded into the live
one, so new connections get the new certificate, connections already open keep theirs, and a bad new pair (a
certificate written before its key, a typo) is logged while the old pair keeps serving. Both files are read from one
private copy for the check and the load, so a file replaced between the two cannot slip past the check.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import ssl
import tempfile
from pathlib import Path

from voxwire.errors import InvalidInputError

logger = logging.getLogger(__name__)


class ServerCertificate:
    """The server's TLS context over a certificate chain and key in PEM files, reloaded when they change."""

    def __init__(self, cert: Path, key: Path) -> None:
        """Load the pair.

        Raises:
            InvalidInputError: a file cannot be read, or the pair is not a PEM certificate with its private key.
        """
        self.cert, self.key = cert, key
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._stamps = self._modified()
        _load_checked(self.context, cert, key)
        logger.info("TLS: serving HTTPS and WSS with %s", cert)

    def reload(self, why: str) -> bool:
        """Load the files again into the live context (``why``: what asked, for the log); whether it took."""
        self._stamps = self._modified()
        try:
            _load_checked(self.context, self.cert, self.key)
        except InvalidInputError as exc:
            logger.error("TLS: %s, but the new pair is refused (%s): still serving the old certificate", why, exc)
            return False
        logger.info("TLS: %s: new connections get the certificate in %s", why, self.cert)
        return True

    def changed(self) -> bool:
        """Whether either file's modification time (or presence) changed since the last load."""
        return self._modified() != self._stamps

    async def watch(self, poll_s: float) -> None:
        """Reload whenever the files change, looking every ``poll_s`` seconds; runs until cancelled."""
        while True:
            await asyncio.sleep(poll_s)
            if self.changed():
                self.reload("the certificate files changed")

    def _modified(self) -> tuple[int | None, int | None]:
        return _mtime(self.cert), _mtime(self.key)


def _mtime(path: Path) -> int | None:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return None


def _load_checked(context: ssl.SSLContext, cert: Path, key: Path) -> None:
    """Check the pair on a fresh context, then load it into ``context`` (both from one private copy).

    Raises:
        InvalidInputError: a file cannot be read, or the pair does not load (not PEM, key and certificate differ).
    """
    with tempfile.TemporaryDirectory(prefix="voxwire-tls-") as folder:
        copies = Path(folder) / "cert.pem", Path(folder) / "key.pem"
        for source, copy in zip((cert, key), copies, strict=True):
            try:
                shutil.copyfile(source, copy)
            except OSError as exc:
                raise InvalidInputError(f"cannot read the TLS file {source}: {exc.strerror or exc}") from exc
        try:
            ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(*copies)
        except ssl.SSLError as exc:
            raise InvalidInputError(
                f"{cert} and {key} are not a PEM certificate chain and its private key ({exc.reason or exc})"
            ) from exc
        context.load_cert_chain(*copies)


def server_certificate(cert: Path | None, key: Path | None) -> ServerCertificate | None:
    """The configured certificate (``Transport.tls_cert``/``tls_key``), None for plain HTTP.

    Raises:
        InvalidInputError: as ``ServerCertificate``.
    """
    if cert is None or key is None:
        return None
    return ServerCertificate(cert, key)
