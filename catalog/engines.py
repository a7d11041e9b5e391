"""What each kind of engine does on its own, read from its kind and its command template.

Pure data and functions (no Django): the gateway asks them which endpoints a profile's
engines serve, how long their context is, and which OpenAI behaviours (``n`` > 1, cancelling
an unstreamed request when the client hangs up, a usage chunk at the end of a stream, a
tokenizer endpoint) it must supply itself (docs/architecture.md, "Gateway rules").

Where the facts come from: llama-cpp-python's server (``llama_cpp/server``: ``--n_ctx``,
``--embedding``, ``POST /extras/tokenize``, no ``n``, no usage chunk, a non-streamed request
runs to its end), llama.cpp's ``tools/server`` README (``-c/--ctx-size``, ``--embedding(s)``,
``POST /tokenize``, ``n`` unsupported), vLLM's ``serve`` arguments (``--max-model-len``,
``--task embed`` / ``--runner pooling``, ``POST /tokenize``) and SGLang's server arguments
(``--context-length``, ``--is-embedding``; its tokenizer endpoint is not OpenAI-shaped, so
none is used).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

#: Kept equal to ``catalog.models.OPENAI_ENDPOINTS`` (a test checks; models imports this module).
ALL_ENDPOINTS = ("chat/completions", "completions", "embeddings")
TEXT_ENDPOINTS = frozenset({"chat/completions", "completions"})

#: Context lengths above this are not believed from a command (a typo, or a hostile value).
MAX_CONTEXT_LENGTH = 100_000_000


@dataclass(frozen=True)
class EngineTraits:
    """What one engine started with one command does itself.

    ``endpoints``: the names under ``/v1/`` it serves (of ``ALL_ENDPOINTS``).
    ``context_length``: tokens, from a literal flag in its command; None when unknown.
    ``serves_n``: it answers ``n`` > 1 itself (else the gateway must fan out or refuse).
    ``cancels_unstreamed``: a non-streamed request stops when its connection is closed.
    ``streams_usage``: a stream asked for ``stream_options.include_usage`` ends with a
    usage chunk. ``tokenize_path``: ``POST`` path of its tokenizer (None: none), taking
    ``{tokenize_field: text}`` and answering ``{"tokens": [...]}``.
    """

    engine: str
    endpoints: frozenset[str]
    context_length: int | None
    serves_n: bool
    cancels_unstreamed: bool
    streams_usage: bool
    tokenize_path: str | None
    tokenize_field: str | None
    #: A completions ``prompt`` that is a list of several texts (llama-cpp-python: one only).
    serves_prompt_lists: bool = True
    #: The ``developer`` role (llama-cpp-python knows system, user, assistant, tool, function).
    knows_developer_role: bool = True
    #: ``echo`` honoured in a stream (llama-cpp-python drops it there).
    echoes_in_streams: bool = True
    #: ``tool_choice: "required"`` honoured (llama-cpp-python answers in text instead).
    serves_tool_choice_required: bool = True
    #: Image parts in messages understood: llama.cpp's servers only when started with a
    #: projector (``--clip_model_path``, ``--mmproj``); others as far as we know.
    serves_images: bool = True
    #: Audio parts in messages understood (llama.cpp's servers: no).
    serves_audio: bool = True
    #: A completions ``prompt`` of token ids (``[1, 2]``, ``[[1], [2]]``) understood
    #: (llama-cpp-python 0.3.36: 500 "Input should be a valid string").
    serves_token_prompts: bool = True
    #: System messages dropped by its chat template (llama-cpp-python's ``--chat_format
    #: gemma``: Gemma has no system role, and the format discards them without a word): the
    #: gateway folds them into the first user turn, as Gemma's own template does.
    drops_system_messages: bool = False
    #: Engine extras refused because a bad value crashes the engine for everyone
    #: (llama-cpp-python 0.3.36 dies with SIGSEGV on a malformed ``grammar``).
    refused_fields: tuple[str, ...] = ()

    def tokenize_body(self, text: str) -> dict[str, str]:
        """The JSON body of a tokenizer request for ``text``; ValueError if it has none."""
        if not self.tokenize_field:
            raise ValueError(f"{self.engine} has no tokenizer endpoint")
        return {self.tokenize_field: text}


#: Traits of an engine that is not ours to know (a custom command, an external service):
#: treated as OpenAI itself.
OPENAI_LIKE = EngineTraits("custom", frozenset(ALL_ENDPOINTS), None, True, True, True, None, None)

# engine → (serves_n, cancels_unstreamed, streams_usage, tokenize_path, tokenize_field)
_BEHAVIOUR: dict[str, tuple[bool, bool, bool, str | None, str | None]] = {
    "llama_cpp_python": (False, False, False, "/extras/tokenize", "input"),
    "llama_server": (False, True, True, "/tokenize", "content"),
    "vllm": (True, True, True, "/tokenize", "prompt"),
    "sglang": (True, True, True, None, None),
}

#: What else an engine does otherwise than OpenAI (checked on llama-cpp-python 0.3.36).
_QUIRKS: dict[str, dict] = {
    "llama_cpp_python": {"serves_prompt_lists": False, "knows_developer_role": False, "echoes_in_streams": False,
                         "serves_tool_choice_required": False, "serves_audio": False, "refused_fields": ("grammar",),
                         "serves_token_prompts": False},
    "llama_server": {"serves_audio": False},
}

#: The flags that give a llama.cpp server a vision projector (images in messages).
_PROJECTOR_FLAGS = {"llama_cpp_python": ("--clip_model_path",), "llama_server": ("--mmproj", "-mm", "--mmproj-url")}

#: llama-cpp-python's chat formats that drop system messages (0.3.36: ``format_gemma``).
_SYSTEMLESS_CHAT_FORMATS = frozenset({"gemma"})

#: The flags that carry the context length, per engine.
_CONTEXT_FLAGS: dict[str, tuple[str, ...]] = {
    "llama_cpp_python": ("--n_ctx",),
    "llama_server": ("-c", "--ctx-size"),
    "vllm": ("--max-model-len", "--max_model_len"),
    "sglang": ("--context-length",),
}


def command_words(command: str) -> list[str]:
    """The words of a command template as a shell would split them (falling back to
    whitespace for a template with unbalanced quotes)."""
    try:
        return shlex.split(command or "")
    except ValueError:
        return (command or "").split()


def flag_values(words: list[str], flags: tuple[str, ...]) -> list[str | None]:
    """The values given to any of ``flags``, in order: ``--flag V`` and ``--flag=V``; a flag
    followed by nothing or by another option gives None (a bare switch)."""
    found: list[str | None] = []
    for i, word in enumerate(words):
        for flag in flags:
            if word == flag:
                nxt = words[i + 1] if i + 1 < len(words) else None
                found.append(None if nxt is None or (nxt.startswith("-") and not _is_int(nxt)) else nxt)
            elif word.startswith(flag + "="):
                found.append(word[len(flag) + 1:])
    return found


def _is_int(text: str) -> bool:
    try:
        int(text)
    except ValueError:
        return False
    return True


def context_length_from_command(engine: str, command: str) -> int | None:
    """Tokens of context the command's own flag sets (the last one given wins, as with
    argparse), or None: no flag, a template placeholder (``--n_ctx {ctx}``), or not a
    positive integer up to :data:`MAX_CONTEXT_LENGTH`."""
    values = flag_values(command_words(command), _CONTEXT_FLAGS.get(engine, ()))
    if not values or values[-1] is None:
        return None
    try:
        n = int(values[-1])
    except ValueError:
        return None
    return n if 1 <= n <= MAX_CONTEXT_LENGTH else None


def _serves_embeddings(engine: str, words: list[str]) -> bool:
    if engine == "llama_cpp_python":
        values = flag_values(words, ("--embedding",))
        return bool(values) and (values[-1] or "").lower() == "true"
    if engine == "llama_server":
        return any(w in ("--embedding", "--embeddings") for w in words)
    if engine == "vllm":
        task = flag_values(words, ("--task",))
        runner = flag_values(words, ("--runner",))
        return (bool(task) and task[-1] == "embed") or (bool(runner) and runner[-1] == "pooling")
    if engine == "sglang":
        return "--is-embedding" in words
    return True


def default_endpoints(engine: str, command: str) -> frozenset[str]:
    """The endpoints under ``/v1/`` an engine of kind ``engine`` serves when started with
    ``command``: chat and text completions, plus embeddings when started for them; every one
    of ``ALL_ENDPOINTS`` for a custom (or unknown) engine."""
    if engine not in _BEHAVIOUR:
        return frozenset(ALL_ENDPOINTS)
    if _serves_embeddings(engine, command_words(command)):
        return frozenset(ALL_ENDPOINTS)
    return TEXT_ENDPOINTS


def engine_traits(engine: str, command: str) -> EngineTraits:
    """The :class:`EngineTraits` of an engine of kind ``engine`` (a ``Profile.Engine``
    value) started with the command template ``command``. An unknown kind is a custom one."""
    if engine not in _BEHAVIOUR:
        return EngineTraits(engine or "custom", frozenset(ALL_ENDPOINTS), None, True, True, True, None, None)
    serves_n, cancels, usage, path, field = _BEHAVIOUR[engine]
    quirks = dict(_QUIRKS.get(engine, {}))
    if engine in _PROJECTOR_FLAGS:
        words = command_words(command)
        quirks["serves_images"] = any(w == f or w.startswith(f + "=") for w in words for f in _PROJECTOR_FLAGS[engine])
    if engine == "llama_cpp_python":
        quirks["drops_system_messages"] = any(
            (v or "").lower() in _SYSTEMLESS_CHAT_FORMATS for v in flag_values(command_words(command), ("--chat_format",)))
    return EngineTraits(engine, default_endpoints(engine, command), context_length_from_command(engine, command),
                        serves_n, cancels, usage, path, field, **quirks)
