#!/usr/bin/env python3
"""Render the shipped HAProxy or nginx configuration for a set of voxwire replicas.

    python scripts/deploy/render.py haproxy --listen :8080 --replica 10.0.0.5:8000 --replica 10.0.0.6:8000
    python scripts/deploy/render.py haproxy --listen :8080 --dns voxwire-headless.voxwire.svc.cluster.local:8000
    python scripts/deploy/render.py nginx --listen 8080 --replica 10.0.0.5:8000 --replica 10.0.0.6:8000

The templates (``haproxy.cfg.in``, ``nginx.conf.in``) hold every setting; this fills in only the listen
address and the replicas, so the tests run exactly the shipped configurations on loopback ports. With
``--dns`` HAProxy discovers the replicas itself (a Kubernetes headless Service resolves to every ready
pod), up to ``--max-replicas``.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
TEMPLATES = {"haproxy": HERE / "haproxy.cfg.in", "nginx": HERE / "nginx.conf.in"}
_PLACEHOLDER = re.compile(r"\$\{([A-Z_]+)\}")
"""``${NAME}``: nginx's own variables are ``$name`` (no braces), so the two never collide."""

_RESOLVERS = """resolvers dns
    parse-resolv-conf
    # Pods come and go: re-resolve often, and keep a vanished address for a few seconds only.
    hold valid 5s
    hold obsolete 5s
"""


@dataclass(frozen=True)
class Upstreams:
    """Where the replicas are: fixed ``host:port`` addresses, or a DNS name (with port) to discover them by."""

    replicas: tuple[str, ...] = ()
    dns: str | None = None
    max_replicas: int = 16

    def __post_init__(self) -> None:
        if bool(self.replicas) == (self.dns is not None):
            raise ValueError("give either replica addresses or one DNS name")
        for address in (*self.replicas, *([self.dns] if self.dns else [])):
            if not re.fullmatch(r"[A-Za-z0-9.\-\[\]:]+:\d{1,5}", address):
                raise ValueError(f"{address!r} is not host:port")
        if self.max_replicas < 1:
            raise ValueError("max_replicas must be >= 1")


def render(kind: str, listen: str, upstreams: Upstreams) -> str:
    """The configuration text of ``kind`` (``haproxy`` or ``nginx``)."""
    if not re.fullmatch(r"[A-Za-z0-9.\-\[\]:*]*:?\d{1,5}", listen):
        raise ValueError(f"--listen {listen!r} must be a port or address:port")
    if kind == "haproxy":
        values = {"LISTEN": listen, **_haproxy_servers(upstreams)}
    elif kind == "nginx":
        if upstreams.dns is not None:
            raise ValueError("nginx resolves upstream names once, at start: give it --replica addresses")
        lines = [f"    server {address} max_fails=1 fail_timeout=5s;" for address in upstreams.replicas]
        values = {"LISTEN": listen, "SERVERS": "\n".join(lines)}
    else:
        raise ValueError(f"unknown configuration {kind!r}; one of {sorted(TEMPLATES)}")
    template = TEMPLATES[kind].read_text()
    missing = set(_PLACEHOLDER.findall(template)) - set(values)
    if missing:
        raise ValueError(f"{TEMPLATES[kind].name} has placeholders nothing fills: {sorted(missing)}")
    return _PLACEHOLDER.sub(lambda match: values[match.group(1)], template)


def _haproxy_servers(upstreams: Upstreams) -> dict[str, str]:
    if upstreams.dns is None:
        lines = [f"    server replica{n} {address} check" for n, address in enumerate(upstreams.replicas, 1)]
        return {"SERVERS": "\n".join(lines), "RESOLVERS": ""}
    line = f"    server-template replica {upstreams.max_replicas} {upstreams.dns} check resolvers dns init-addr none"
    return {"SERVERS": line, "RESOLVERS": "\n" + _RESOLVERS}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("kind", choices=sorted(TEMPLATES))
    parser.add_argument("--listen", default="8080", help="port or address:port the balancer listens on")
    parser.add_argument("--replica", action="append", default=[], help="a replica's host:port (repeatable)")
    parser.add_argument("--dns", help="HAProxy only: host:port whose DNS name lists the replicas (headless Service)")
    parser.add_argument("--max-replicas", type=int, default=16, help="with --dns: the most replicas tracked")
    parser.add_argument("--out", type=Path, help="write here instead of standard output")
    args = parser.parse_args(argv)
    try:
        text = render(args.kind, args.listen, Upstreams(tuple(args.replica), args.dns, args.max_replicas))
    except ValueError as exc:
        parser.error(str(exc))
    if args.out is None:
        sys.stdout.write(text)
    else:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
