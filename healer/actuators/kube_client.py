"""The Kubernetes actuator's use of the official client (healer/actuators/kubernetes.py): one
``ApiClient`` per actuator, its calls run in the actuator's bounded pool of threads, answers read as
plain JSON.

What a call costs was measured in a burst of a thousand nodes (#43, docs/performance.md): each call's
body is read, parsed (``orjson``) and its connection handed back to the client's pool in the worker
thread, so the event loop does none of it and the next call reuses the connection (HTTP keep-alive);
the environment's proxy is read once when the client is built, not before every call; the client's
API and model classes are imported with this module, not by the first call.

Only this module and kubernetes.py import ``kubernetes``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Final

import orjson
import urllib3.exceptions
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config

from healer import config, errors
from healer.actuators import batching

CoreV1Api: Final = k8s_client.CoreV1Api
V1Eviction: Final = k8s_client.V1Eviction
V1ObjectMeta: Final = k8s_client.V1ObjectMeta
"""Resolved when this module is imported: the client imports its API and model modules on first use,
and the first call of a burst paid that (about half a second of CPU) on the event loop (#43)."""


class ApiError(errors.HealerError):
    """A non-2xx answer from the API server, with its code and the server's own message."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


def build_api_client(settings: config.ActuatorSettings) -> k8s_client.ApiClient:
    """In-cluster service account, else the kubeconfig (``kube_config`` or the default one)."""
    cfg = k8s_client.Configuration()
    try:
        if settings.kube_config:
            k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=settings.kube_config,
                context=settings.kube_context,
                client_configuration=cfg,
                persist_config=False,
            )
        else:
            try:
                k8s_config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
            except k8s_config.ConfigException:
                k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
                    context=settings.kube_context, client_configuration=cfg, persist_config=False
                )
    except (k8s_config.ConfigException, OSError, ValueError) as e:
        raise errors.PermanentError(f"no usable Kubernetes configuration: {e}") from e
    cfg.connection_pool_maxsize = max(cfg.connection_pool_maxsize, batching.KUBE_CONCURRENCY)
    # The loader's token hook runs before every call and sets the host again, and each time the client
    # read every environment variable for a proxy (a third of a call's CPU, #43). The proxy the
    # environment names for this host is read once, here: the client's connection pool is built once
    # from it anyway (an explicit ``proxy-url`` of the kubeconfig is already fixed the same way).
    cfg.proxy = cfg.proxy
    return k8s_client.ApiClient(cfg)


async def call(
    pool: batching.BoundedPool,
    core: k8s_client.CoreV1Api,
    timeout_s: float,
    method: str,
    *args: Any,
    **kwargs: Any,
) -> Any:
    """``core.method(*args, **kwargs)`` in ``pool``: its JSON body back, or ``ApiError`` (a non-2xx
    answer) / ``TemporaryError`` (unreachable, or an answer that is not JSON)."""
    kwargs.update(_preload_content=False, _request_timeout=timeout_s)
    try:
        return await pool.run(read_json, getattr(core, method), *args, **kwargs)
    except k8s_client.ApiException as e:
        raise ApiError(int(e.status or 0), message(e.body, e.reason)) from e
    except (urllib3.exceptions.HTTPError, OSError) as e:
        raise errors.TemporaryError(f"Kubernetes API unreachable: {e}") from e


def read_json(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """In a worker thread: the call, its whole body read there (not on the event loop) and parsed, and
    the connection handed back to the client's pool for the next call (HTTP keep-alive, #43)."""
    response = fn(*args, **kwargs)
    try:
        data = response.data
    finally:
        response.release_conn()
    try:
        return orjson.loads(data or b"{}")
    except orjson.JSONDecodeError as e:
        raise errors.TemporaryError(f"Kubernetes API answered something that is not JSON: {e}") from e


def message(body: Any, fallback: Any) -> str:
    """The message of the API server's ``Status`` answer (with its causes'), else ``fallback``."""
    try:
        status = json.loads(body)
        text = status.get("message") if isinstance(status, dict) else None
        causes = (status.get("details") or {}).get("causes") or [] if isinstance(status, dict) else []
        extra = "; ".join(str(c.get("message")) for c in causes if isinstance(c, dict) and c.get("message"))
        if text:
            return f"{text} ({extra})" if extra else str(text)
    except (TypeError, ValueError):
        pass
    return str(fallback or "no message")
