"""Token counts from an engine's own tokenizer endpoint (issue 15: usage the client asked for).

Engines that report no usage (llama-cpp-python's server in streams) still count tokens when
asked. The endpoints and their shapes, from each server's source:

* llama-cpp-python: ``POST /extras/tokenize`` ``{"input": text}`` → ``{"tokens": [ids]}``,
  and ``POST /extras/tokenize/count`` ``{"input": text}`` → ``{"count": n}``
  (``llama_cpp/server/app.py``, ``TokenizeInputRequest``);
* llama.cpp's llama-server: ``POST /tokenize`` ``{"content": text}`` → ``{"tokens": [ids]}``
  (with ``with_pieces`` the tokens are objects; they are counted all the same). Without
  ``content`` it answers ``{"tokens": []}``, which would read as 0;
* vLLM: ``POST /tokenize`` ``{"prompt": text}`` → ``{"count": n, "max_model_len": …,
  "tokens": [ids]}``.

llama-server and vLLM share the path, so a bare ``/tokenize`` gets both ``content`` and
``prompt`` unless ``engine`` says which (vLLM logs the field it ignores; llama-server
ignores it silently).

The count is the tokenizer's for the text alone; see ``gateway.assembly.prompt_text`` for
what that leaves out of a chat prompt.
"""

from __future__ import annotations

import asyncio
import json
import logging

import aiohttp

from llmgw import integers

log = logging.getLogger(__name__)

#: The tokenizer endpoint of each engine (``catalog.models.Profile.Engine`` values) that has
#: one the gateway knows; SGLang and custom commands are not counted this way.
TOKENIZE_PATHS = {
    "llama_cpp_python": "/extras/tokenize",
    "llama_server": "/tokenize",
    "vllm": "/tokenize",
}

#: The most a tokenizer answer may be (a list of ids for a 10 MiB prompt is about that much).
MAX_ANSWER_BYTES = 64 * 1024 * 1024


def tokenize_body(tokenize_path: str, text: str, engine: str | None = None) -> dict:
    """The JSON body that asks the endpoint at ``tokenize_path`` to tokenize ``text``:
    ``{"input": text}`` for llama-cpp-python's ``/extras/…`` paths; for ``/tokenize``
    ``{"content": text}`` (llama-server), ``{"prompt": text}`` (vLLM), or both when
    ``engine`` is not one of those two."""
    if tokenize_path.rstrip("/").startswith("/extras/"):
        return {"input": text}
    if engine == "llama_server":
        return {"content": text}
    if engine == "vllm":
        return {"prompt": text}
    return {"content": text, "prompt": text}


def token_count(answer: object) -> int | None:
    """The count in a tokenizer's answer: ``count`` when it is a count (vLLM, llama-cpp-python's
    ``/extras/tokenize/count``), else the length of the ``tokens`` list; None for any other
    shape."""
    if not isinstance(answer, dict):
        return None
    count = integers.count_or_none(answer.get("count"))
    if count is not None:
        return count
    tokens = answer.get("tokens")
    return len(tokens) if isinstance(tokens, list) else None


async def count_tokens(session: aiohttp.ClientSession, base_url: str, key: str | None, tokenize_path: str,
                       text: str, timeout_s: float = 2.0, *, engine: str | None = None) -> int | None:
    """The number of tokens in ``text`` by the engine at ``base_url`` (``http://host:port``,
    without ``/v1``), asked at ``tokenize_path`` (:data:`TOKENIZE_PATHS`) with
    :func:`tokenize_body` and read with :func:`token_count`. ``key`` goes as ``Authorization:
    Bearer key`` when given. The whole exchange has ``timeout_s`` seconds.

    Never raises (except cancellation): None on a connection error, a timeout, a status
    other than 200, an answer that is not JSON or has no count, or one over
    :data:`MAX_ANSWER_BYTES`. Empty text is 0 without a request."""
    if not text:
        return 0
    url = base_url.rstrip("/") + "/" + tokenize_path.lstrip("/")
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        async with asyncio.timeout(timeout_s):
            async with session.post(url, json=tokenize_body(tokenize_path, text, engine), headers=headers,
                                    allow_redirects=False) as response:
                if response.status != 200:
                    log.debug("tokenizer at %s answered %s", url, response.status)
                    return None
                body = bytearray()
                async for piece in response.content.iter_any():
                    body += piece
                    if len(body) > MAX_ANSWER_BYTES:
                        return None
                return token_count(json.loads(body))
    except asyncio.CancelledError:
        raise
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, RecursionError, UnicodeError, OSError) as exc:
        log.debug("tokenizer at %s failed: %s", url, exc or type(exc).__name__)
        return None
    except Exception:  # an odd answer must never fail the request it counts for
        log.warning("tokenizer at %s failed unexpectedly", url, exc_info=True)
        return None
