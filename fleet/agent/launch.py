"""How an engine is launched: its argv from the profile's template, the environment it gets
(none of the agent's secrets), the address it binds and the one the agent probes it on, and
its URL paths. Plain functions of their arguments, used by ``fleet.agent.engines``."""

from __future__ import annotations

import ipaddress
import shlex
import socket


def url_path(path: str) -> str:
    """A profile's readiness or metrics path as the path of the engine's own URL: one that
    does not start with "/" (``@host/…`` would name another host) is made one."""
    return path if path.startswith("/") else "/" + path


def render_command(template: str, values: dict[str, object]) -> list[str]:
    """Split a command template like a shell would and fill each word's placeholders."""
    return [word.format(**values) for word in shlex.split(template)]


#: Inherited variables an engine never gets: the agent's own settings and secrets (its
#: token, and on an all-in-one machine the control plane's secret key, database URL, admin
#: password, metrics token), all spelled ``LLMGW_*``.
SECRET_PREFIXES = ("LLMGW_",)
#: Inherited variables that would override the address and port the agent chose
#: (llama-cpp-python's server lets ``HOST``/``PORT`` win over ``--host``/``--port``).
#: A profile's env may still set them.
BIND_OVERRIDES = ("HOST", "PORT")


def engine_environment(inherited: dict[str, str], profile_env: dict[str, str] | None, gpus: str,
                       api_key: str) -> dict[str, str]:
    """The environment an engine starts with (docs/architecture.md, "Security": engine keys;
    engines inherit none of the agent's secrets): ``inherited`` (the agent's environment)
    without any ``LLMGW_*`` variable and without ``HOST``/``PORT``, then the profile's env with
    ``{api_key}`` in its values replaced by the replica's key, then ``CUDA_VISIBLE_DEVICES``
    (the GPUs assigned, "" for none). Without a key (a control plane from before engine keys) a
    variable that would hold only the key is left out rather than set empty (an empty key means
    "no key" to some engines and an impossible one to others)."""
    env = {k: v for k, v in inherited.items()
           if not k.upper().startswith(SECRET_PREFIXES) and k.upper() not in BIND_OVERRIDES}
    for name, value in (profile_env or {}).items():
        value = str(value)
        if not api_key and value.strip() == "{api_key}":
            continue
        env[str(name)] = value.replace("{api_key}", api_key)
    env["CUDA_VISIBLE_DEVICES"] = gpus
    return env


def resolve_bind_host(address: str) -> str:
    """The IP address to listen on for an advertised ``address`` (an IP, or a host name,
    resolved to its first address); ValueError if a name does not resolve, or if it is
    (or resolves to) the unspecified address: every interface is ``--bind-host``'s to ask."""
    address = address.strip().strip("[]")
    try:
        ipaddress.ip_address(address.split("%", 1)[0])  # an IPv6 address may carry a %zone
        resolved = address
    except ValueError:
        try:
            infos = socket.getaddrinfo(address, None, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError) as exc:
            raise ValueError(f"cannot resolve the advertised address {address!r}: {exc}") from exc
        resolved = infos[0][4][0]
    if ipaddress.ip_address(resolved.split("%", 1)[0]).is_unspecified:
        raise ValueError(f"the advertised address {address!r} is {resolved}, every interface: engines listen "
                         "there only with --bind-host 0.0.0.0")
    return resolved


def probe_host(host: str) -> str:
    """Where this machine reaches an engine listening on ``host``, ready for a URL: the
    address itself (IPv6 in brackets); loopback for the wildcard addresses."""
    if host in ("", "0.0.0.0"):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host
