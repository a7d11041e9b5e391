"""Engine profile presets: command templates, readiness paths and load metrics per engine.

Placeholders a command template may use (rendered by the agent on the machine that runs it):

``{python}`` the agent's Python interpreter · ``{weights_path}`` local path of the weights ·
``{host}`` bind address · ``{port}`` the engine's port · ``{served_name}`` the model name
clients use · ``{gpus}`` comma-separated GPU indices · ``{tp_size}`` tensor-parallel size
(GPUs per replica) · ``{threads}`` CPU threads for CPU engines · ``{api_key}`` the
replica's engine key (a fresh secret per replica that only the gateway holds).

``{api_key}`` may also appear in the profile's ``env`` values (only that placeholder is
filled there). Every preset starts its engine with the key, so a request to an engine port
without it is refused (docs/architecture.md, "Security": engine keys). Where an engine reads
the key from its environment the preset passes it there: a process's environment is readable
only by its owner, its command line by every local user (``/proc/PID/cmdline``).
llama-cpp-python's server reads ``API_KEY`` (pydantic-settings), llama-server ``LLAMA_API_KEY``
(``--api-key``'s env), vLLM ``VLLM_API_KEY``; SGLang has no such variable and gets
``--api-key {api_key}``.

vLLM, SGLang and llama-server are *unverified* here (no GPU on these machines): their
command lines are snapshot-tested, not run.
"""

from __future__ import annotations

import string

PLACEHOLDERS = frozenset(
    {"python", "weights_path", "host", "port", "served_name", "gpus", "tp_size", "threads", "api_key"}
)

#: The placeholder that carries the engine key; the only one filled in ``env`` values.
API_KEY_PLACEHOLDER = "{api_key}"


def template_fields(template: str) -> set[str]:
    """Names of the ``{placeholders}`` in a command template; ValueError if malformed."""
    names = set()
    for _, field, _, _ in string.Formatter().parse(template):
        if field is not None:
            if field == "" or not field.isidentifier():
                raise ValueError(f"'{{{field}}}' is not a placeholder name")
            names.add(field)
    return names


def uses_api_key(command: str, env: dict | None) -> bool:
    """True if a profile starts its engine with the replica's key: ``{api_key}`` in the
    command template or in one of its env values. A profile without it runs an engine that
    anyone who reaches its port can use around the gateway (allowed, for custom engines
    that take no key; ``explain`` and the admin say so)."""
    try:
        if "api_key" in template_fields(command or ""):
            return True
    except ValueError:
        pass
    return any(isinstance(v, str) and API_KEY_PLACEHOLDER in v for v in (env or {}).values())


PRESETS: dict[str, dict] = {
    "llama-cpp-python-cpu": {
        "engine": "llama_cpp_python",
        "command": (
            "{python} -m llama_cpp.server --model {weights_path} --host {host} --port {port}"
            " --model_alias {served_name} --n_ctx 2048 --chat_format gemma"
            " --n_threads {threads} --interrupt_requests False"
        ),
        "env": {"API_KEY": "{api_key}"},
        "gpus_needed": 0,
        "gpu_memory_mib": 0,
        "cpu_cores": 1,
        "memory_mib": 1024,
        "readiness_path": "/v1/models",
        "startup_timeout_s": 300,
        "metrics_path": "",
        "metric_running": "",
        "metric_waiting": "",
        "notes": "llama-cpp-python's OpenAI server on the CPU (verified). Reports no load. "
                 "--interrupt_requests False: by default a new request (even a readiness check) cuts off "
                 "the stream in progress. The engine key goes in API_KEY (its settings read it).",
    },
    "llama-server-gpu": {
        "engine": "llama_server",
        "command": (
            "llama-server -m {weights_path} --host {host} --port {port} --alias {served_name}"
            " --metrics -ngl 999"
        ),
        "env": {"LLAMA_API_KEY": "{api_key}"},
        "gpus_needed": 1,
        "gpu_memory_mib": 8192,
        "cpu_cores": 0,
        "memory_mib": 0,
        "readiness_path": "/health",
        "startup_timeout_s": 600,
        "metrics_path": "/metrics",
        "metric_running": "llamacpp:requests_processing",
        "metric_waiting": "llamacpp:requests_deferred",
        "notes": "llama.cpp's C++ server; unverified until run on a GPU. The engine key goes in "
                 "LLAMA_API_KEY (--api-key's variable).",
    },
    "vllm": {
        "engine": "vllm",
        "command": (
            "vllm serve {weights_path} --host {host} --port {port}"
            " --served-model-name {served_name} --tensor-parallel-size {tp_size}"
        ),
        "env": {"VLLM_API_KEY": "{api_key}"},
        "gpus_needed": 1,
        "gpu_memory_mib": 40960,
        "cpu_cores": 0,
        "memory_mib": 0,
        "readiness_path": "/health",
        "startup_timeout_s": 900,
        "metrics_path": "/metrics",
        "metric_running": "vllm:num_requests_running",
        "metric_waiting": "vllm:num_requests_waiting",
        "notes": "vLLM; unverified until run on a GPU. The engine key goes in VLLM_API_KEY "
                 "(it guards /v1/*; /health and /metrics stay open).",
    },
    "sglang": {
        "engine": "sglang",
        "command": (
            "{python} -m sglang.launch_server --model-path {weights_path} --host {host}"
            " --port {port} --served-model-name {served_name} --tp-size {tp_size}"
            " --enable-metrics --api-key {api_key}"
        ),
        "gpus_needed": 1,
        "gpu_memory_mib": 40960,
        "cpu_cores": 0,
        "memory_mib": 0,
        "readiness_path": "/health",
        "startup_timeout_s": 900,
        "metrics_path": "/metrics",
        "metric_running": "sglang:num_running_reqs",
        "metric_waiting": "sglang:num_queue_reqs",
        "notes": "SGLang; unverified until run on a GPU. The engine key is on its command line "
                 "(--api-key; SGLang reads no variable for it).",
    },
}
