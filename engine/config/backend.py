"""Where a job's models train: the execution backend.

    local                 this machine's worker processes (the default; nothing else starts)
    ray                   a Ray instance started for the job on this machine, bound to 127.0.0.1
    ray:auto              the Ray cluster already running on this machine (``ray start --head``)
    ray://HOST:PORT       a Ray cluster through its client server (``ray:ray://HOST:PORT`` alike)
    ray:HOST:PORT         a cluster's head (GCS) address, from a node of that cluster

Chosen, first match wins, by the CLI flag ``--backend``, the environment variable ``PRIVACY_LAB_BACKEND`` (the
dashboard and its workers read it), else ``local``. The backend never changes a result: an audit on Ray gives
bit for bit the per-sample scores of a local one (its chunks carry their own seeds), so it is not part of any
job's config and not in the store.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

from engine.config.schema import ConfigError

BACKEND_ENV = "PRIVACY_LAB_BACKEND"
KINDS = ("local", "ray")
_ADDRESS = re.compile(r"^(auto|ray://[A-Za-z0-9.\-\[\]:]+:\d{1,5}|[A-Za-z0-9.\-\[\]]+:\d{1,5})$")
_HELP = "use local, ray, ray:auto or ray://HOST:PORT"


@dataclass(frozen=True)
class BackendConfig:
    """``kind`` "local" or "ray"; ``address`` (ray): None starts an instance on this machine for the job, else
    the cluster to connect to ("auto", "ray://host:port", "host:port")."""

    kind: str = "local"
    address: str | None = None

    @classmethod
    def parse(cls, text, *, field: str = "backend") -> "BackendConfig":
        """``text`` as written on the command line or in the environment (see the module doc); a ConfigError
        naming ``field`` and the accepted forms otherwise."""
        value = text.strip() if isinstance(text, str) else text
        if value in ("", None, "local"):
            return cls()
        if not isinstance(value, str):
            raise ConfigError(field, f"must be text ({_HELP}), got {value!r}")
        if value == "ray":
            return cls("ray")
        address = value[4:] if value.startswith("ray:") and not value.startswith("ray://") else value
        if address == "local":
            return cls("ray")
        if _ADDRESS.match(address) and (address == "auto" or address.startswith("ray://") or ":" in address):
            return cls("ray", address)
        raise ConfigError(field, f"unknown backend {value!r}; {_HELP}")

    @property
    def local_instance(self) -> bool:
        """Ray on an instance started for the job (bound to 127.0.0.1)."""
        return self.kind == "ray" and self.address is None

    def describe(self) -> str:
        """In a user's words (the sidebar, ``privacy-lab list``)."""
        if self.kind == "local":
            return "local workers"
        if self.local_instance:
            return "Ray (an instance on this machine, 127.0.0.1)"
        return "Ray cluster on this machine (auto)" if self.address == "auto" else f"Ray cluster at {self.address}"

    def spec(self) -> str:
        """The text :meth:`parse` reads back (what a worker's environment gets)."""
        return self.kind if self.address is None else f"ray:{self.address}"


def backend_from_env(environ=None) -> BackendConfig:
    """The backend ``PRIVACY_LAB_BACKEND`` names (``local`` when unset); ConfigError("backend", …) when it names
    none."""
    env = os.environ if environ is None else environ
    return BackendConfig.parse(env.get(BACKEND_ENV, ""), field=BACKEND_ENV)
