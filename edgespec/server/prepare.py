"""A validated request body turned into what the engine takes: prompt tokens, sampling parameters, drafting.

Everything a client can get wrong is found here, before the request joins the queue: a field edgespec does not
support, a model it does not serve, a value out of range, a prompt that leaves no room in the context. The
prompt is tokenized off the event loop (:func:`prompt_tokens` runs in a worker thread: llama.cpp's tokenizer
only reads the vocabulary, so it can run beside a decode).
"""

from __future__ import annotations

import json
from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING

from edgespec.constraint import Grammar
from edgespec.engine import MAX_DRAFT_LEN, parse_draft_len
from edgespec.errors import EdgespecError, InvalidParameterError
from edgespec.logprobs import MAX_TOP_LOGPROBS
from edgespec.models.chat_template import ROLES
from edgespec.sampling import SamplingParams
from edgespec.server.errors import ApiError, bad_request
from edgespec.server.request import GenerationRequest, ToolUse
from edgespec.server.schemas import MAX_CHOICES, MAX_REPEAT_PENALTY, ChatCompletionRequest, CompletionRequest, TextPart
from edgespec.tools import (
    call_grammar,
    markers_are_tokens,
    parse_tools,
    template_format,
    template_tool_calls,
)

if TYPE_CHECKING:
    from edgespec.api import Runtime
    from edgespec.server.worker import Loaded

ROLE_ALIASES = {"developer": "system"}  # OpenAI's newer name for the system role


def refuse_unsupported(body: ChatCompletionRequest | CompletionRequest) -> None:
    """A 400 for each OpenAI feature edgespec does not have, rather than an answer that silently lacks it."""

    def refuse(param: str, what: str) -> None:
        raise ApiError(400, f"{what} is not supported by edgespec", param=param, code="unsupported_parameter")

    if body.n is not None and not (isinstance(body.n, int) and 1 <= body.n <= MAX_CHOICES):
        raise bad_request(f"n must be an integer 1..{MAX_CHOICES}", param="n")
    if body.n is not None and body.n > 1 and body.stream:
        refuse("n", "n > 1 with stream (several choices are returned whole)")
    if isinstance(body, ChatCompletionRequest):
        if body.functions not in (None, []) or body.function_call not in (None, "none", "auto"):
            refuse(
                "functions" if body.functions not in (None, []) else "function_call",
                "the deprecated functions/function_call (send tools and tool_choice)",
            )
        if body.audio is not None:
            refuse("audio", "audio output")
        if body.modalities is not None and body.modalities != ["text"]:
            refuse("modalities", "modalities other than text")
        for name in ("reasoning_effort", "verbosity", "web_search_options"):
            if getattr(body, name) is not None:
                refuse(name, name)
    else:
        if body.echo and body.n is not None and body.n > 1:
            refuse("echo", "echo with n > 1")
        if body.echo and body.stream and body.logprobs not in (None, False):
            refuse("echo", "echo with logprobs in a stream (send it without stream: the prompt is scored whole)")
        if body.suffix:
            refuse("suffix", "suffix (fill-in-the-middle)")
        if body.best_of is not None and body.best_of != 1:
            refuse("best_of", "best_of > 1")


def check_model(requested: str | None, served: Sequence[str]) -> None:
    if requested is not None and requested not in served:
        raise ApiError(
            404,
            f"the model {requested!r} is not served here; this server serves {served[0]!r} (GET /v1/models)",
            param="model",
            code="model_not_found",
        )


def response_constraint(body: ChatCompletionRequest | CompletionRequest) -> Grammar | None:
    """OpenAI's ``response_format``: text (no constraint), ``json_object``, or ``json_schema`` (strict)."""
    fmt = body.response_format
    if fmt is None:
        return None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind == "text":
        return None
    if kind == "json_object":
        return Grammar.json_object()
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, (dict, bool)):
            raise bad_request(
                "response_format json_schema needs json_schema.schema, a JSON schema object", param="response_format"
            )
        try:
            grammar = Grammar.json_schema(schema)
            grammar.compiled()  # a schema the constraint engine cannot compile: a 400 naming its problem
        except EdgespecError as exc:
            raise bad_request(str(exc), param="response_format") from exc
        return grammar
    raise bad_request(
        "response_format.type must be text, json_object or json_schema", param="response_format"
    )


def tool_use(body: ChatCompletionRequest, template: str | None) -> ToolUse | None:
    """The request's tools checked against its ``tool_choice`` and against the model's chat template (None when
    there are none, or ``tool_choice`` is ``none``)."""
    if body.tools is None or body.tools == []:
        if body.tool_choice not in (None, "none", "auto"):
            raise bad_request("tool_choice needs tools", param="tool_choice")
        return None
    try:
        tools = parse_tools(body.tools)
    except EdgespecError as exc:
        raise bad_request(str(exc), param="tools") from exc
    choice = body.tool_choice if body.tool_choice is not None else "auto"
    if isinstance(choice, dict):
        function = choice.get("function") if choice.get("type") == "function" else None
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str):
            raise bad_request(
                'tool_choice must be "none", "auto", "required" or {"type": "function", "function": {"name": ...}}',
                param="tool_choice",
            )
        if name not in {t.name for t in tools}:
            raise bad_request(f"tool_choice names {name!r}, which is not among the tools", param="tool_choice")
        choice = name
    elif choice not in ("none", "auto", "required"):
        raise bad_request('tool_choice must be "none", "auto", "required" or a function', param="tool_choice")
    if choice == "none":
        return None
    fmt = template_format(template)
    if fmt is None:
        raise ApiError(
            400,
            "tools are not supported for this model: its chat template takes no tools (tool calls are read in the "
            "Qwen/Hermes <tool_call> format and Llama 3's JSON format)",
            param="tools",
            code="unsupported_parameter",
        )
    return ToolUse(fmt, tuple(tools), choice, body.parallel_tool_calls is True)


def tool_constraint(use: ToolUse, runtime: Runtime) -> Grammar | None:
    """What makes the model call a tool: for ``required`` any of them, for a named choice that one."""
    if use.choice == "auto":
        return None
    chosen = use.tools if use.choice == "required" else tuple(t for t in use.tools if t.name == use.choice)
    special = markers_are_tokens(runtime.engine.target)
    try:
        grammar = call_grammar(use.format, chosen, special_markers=special, several=use.several)
        grammar.compiled()
        return grammar
    except EdgespecError as exc:
        raise bad_request(f"the tools' parameter schemas: {exc}", param="tools") from exc


def check_constraint(runtime: Runtime, request: GenerationRequest) -> None:
    """A 400 when the request's constraint cannot serve this model's vocabulary (a grammar naming a special token it
    lacks): found before the request is queued, not as an error frame in a stream that already said 200. Blocking
    (the first constrained request builds the vocabulary's index, ~1 s)."""
    if request.params.constraint is None:
        return
    from edgespec.constraint import Constraint

    target = runtime.engine.target
    try:
        Constraint(request.params.constraint, target, target.is_eog)
    except EdgespecError as exc:
        raise bad_request(str(exc), param="tools" if request.tools is not None else "response_format") from exc


def chat_messages(body: ChatCompletionRequest) -> list[dict]:
    """The messages as the chat template takes them: a known role and a string content (and an assistant's
    ``tool_calls``, a tool reply's ``tool_call_id``)."""
    messages = []
    for i, message in enumerate(body.messages):
        role = ROLE_ALIASES.get(message.role, message.role)
        if role not in ROLES:
            raise bad_request(
                f"messages[{i}].role must be one of {', '.join((*ROLES, 'developer'))}, got {message.role!r}",
                param=f"messages[{i}].role",
            )
        content = message.content
        if content is None:
            text = ""
        elif isinstance(content, str):
            text = content
        else:
            parts = []
            for part in content:
                if not isinstance(part, TextPart):
                    kind = part.get("type", "?") if isinstance(part, dict) else "?"
                    raise ApiError(
                        400,
                        f"content parts of type {kind!r} are not supported by edgespec (text only)",
                        param=f"messages[{i}].content",
                        code="unsupported_parameter",
                    )
                parts.append(part.text)
            text = "\n".join(parts)
        entry: dict = {"role": role, "content": text}
        if message.tool_calls:
            entry["tool_calls"] = [call.model_dump(exclude_unset=True) for call in message.tool_calls]
        if message.tool_call_id is not None:
            entry["tool_call_id"] = message.tool_call_id
        if message.name is not None:
            entry["name"] = message.name
        messages.append(entry)
    return template_tool_calls(messages, _call_arguments)


def _call_arguments(text: str) -> object:
    """A call's arguments as the template writes them; nesting too deep to parse is left as written."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def completion_prompt(body: CompletionRequest) -> str | list[int]:
    prompt = body.prompt
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        if len(prompt) > 1:
            raise ApiError(
                400,
                "several prompts in one request are not supported by edgespec",
                param="prompt",
                code="unsupported_parameter",
            )
        return prompt[0]
    return prompt


def prompt_tokens(
    runtime: Runtime, source: list[dict] | str | list[int], tools: ToolUse | None = None
) -> tuple[int, ...]:
    """Chat messages rendered with the model's template (and the tools), a text tokenized, or token ids checked.
    Blocking."""
    try:
        if isinstance(source, str):
            tokens = runtime.engine.target.tokenize(source)
        elif source and isinstance(source[0], dict):
            tokens = runtime.render_chat(source, tools.template_tools if tools is not None else None)
        else:
            n_vocab = runtime.engine.target.n_vocab
            bad = next((t for t in source if not 0 <= t < n_vocab), None)
            if bad is not None:
                raise bad_request(f"token id {bad} is outside the vocabulary (0..{n_vocab - 1})", param="prompt")
            tokens = list(source)
    except EdgespecError as exc:  # a template that fails on these messages
        raise bad_request(str(exc), param="messages" if isinstance(source, list) else "prompt") from exc
    if not tokens:
        raise bad_request("the prompt is empty", param="prompt")
    return tuple(tokens)


def generation_request(
    loaded: Loaded,
    body: ChatCompletionRequest | CompletionRequest,
    prompt: tuple[int, ...],
    tools: ToolUse | None = None,
    cache_scope: Hashable | None = None,
) -> GenerationRequest:
    """Sampling parameters and drafting for ``body`` (the server's defaults where it says nothing), with
    max_tokens fitted to the context; ``cache_scope``: whose earlier replies it may draft from (and joins)."""
    try:
        draft_len = _draft_len(body.draft_len) if body.draft_len is not None else loaded.draft_len
    except EdgespecError as exc:
        raise bad_request(str(exc), param="draft_len") from exc
    limit = loaded.runtime.engine.gamma_limit
    if isinstance(draft_len, int) and draft_len > limit:
        why = " (bit-exact: llama.cpp's CPU kernels change at wider batches)" if loaded.runtime.target.bit_exact else ""
        raise bad_request(
            f"draft_len {draft_len} is more than this server's target verifies at once: at most {limit}{why}",
            param="draft_len",
        )
    lookup = loaded.lookup if body.lookup is None else body.lookup
    if lookup and not loaded.lookup_available:
        raise bad_request("prompt lookup is off on this server (it was started with --no-lookup)", param="lookup")

    is_chat = isinstance(body, ChatCompletionRequest)
    requested, param = body.max_tokens, "max_tokens"
    if is_chat and body.max_completion_tokens is not None:
        requested, param = body.max_completion_tokens, "max_completion_tokens"
    echo = not is_chat and bool(body.echo)
    scoring = echo and requested_logprobs(body) is not None
    if requested == 0 and not scoring:
        raise bad_request(f"{param} must be >= 1 (0 only with echo and logprobs: scoring the prompt)", param=param)
    max_tokens = _fit_context(
        loaded.runtime, len(prompt), requested, draft_len, param, "messages" if is_chat else "prompt"
    )

    fields = {
        name: getattr(body, name)
        for name in (
            "temperature", "top_p", "top_k", "min_p", "repeat_penalty", "repeat_last_n", "presence_penalty",
            "frequency_penalty",
        )
        if getattr(body, name) is not None
    }  # fmt: skip
    penalty = body.repeat_penalty
    if penalty is not None and penalty > 0 and not 1 / MAX_REPEAT_PENALTY <= penalty <= MAX_REPEAT_PENALTY:
        raise bad_request(
            f"repeat_penalty must be in [{1 / MAX_REPEAT_PENALTY:g}, {MAX_REPEAT_PENALTY:g}] (1 = off), got {penalty}",
            param="repeat_penalty",
        )
    if body.logit_bias:
        fields["logit_bias"] = _logit_bias(body.logit_bias, loaded.runtime.engine.target.n_vocab)
    stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    seed = body.seed if body.seed is not None and body.seed >= 0 else None
    fields["logprobs"] = requested_logprobs(body)
    if scoring:
        fields["prompt_logprobs"] = fields["logprobs"]
    constraint = response_constraint(body)
    if tools is not None:
        called = tool_constraint(tools, loaded.runtime)
        if called is not None and constraint is not None:
            raise bad_request(
                "response_format and a required tool call cannot both constrain the reply", param="response_format"
            )
        constraint = constraint or called
    fields["constraint"] = constraint
    try:
        params = SamplingParams(**fields, seed=seed, max_tokens=max_tokens, stop=tuple(stop))
    except EdgespecError as exc:
        raise bad_request(str(exc)) from exc
    echoed = None
    if echo:  # the prompt as sent (a token list as its text)
        source = completion_prompt(body)  # type: ignore[arg-type]
        echoed = source if isinstance(source, str) else loaded.runtime.engine.target.detokenize(prompt)
    cache_prompt = body.cache_prompt is not False
    return GenerationRequest(prompt, params, draft_len, lookup, body.n or 1, echoed, tools, cache_prompt, cache_scope)


def _draft_len(value: int | str) -> int | str:
    """:func:`parse_draft_len` on ASCII only: "²" is a digit to ``str.isdigit``, but not to ``int``."""
    if isinstance(value, str) and not value.isascii():
        raise InvalidParameterError(f"draft_len must be 'auto', 'off' or an integer 0..{MAX_DRAFT_LEN}, got {value!r}")
    return parse_draft_len(value)


def requested_logprobs(body: ChatCompletionRequest | CompletionRequest) -> int | None:
    """How many alternatives to list per token (0: the token's own log-probability only), or None for none: chat's
    ``logprobs: true`` with ``top_logprobs``, or the completions' ``logprobs: N``."""
    if isinstance(body, ChatCompletionRequest):
        if body.logprobs not in (None, True, False):
            raise bad_request(
                "logprobs must be true or false (top_logprobs says how many alternatives)", param="logprobs"
            )
        top = body.top_logprobs
        if top is not None and not (isinstance(top, int) and 0 <= top <= MAX_TOP_LOGPROBS):
            raise bad_request(f"top_logprobs must be an integer 0..{MAX_TOP_LOGPROBS}", param="top_logprobs")
        if top is not None and not body.logprobs:
            raise bad_request("top_logprobs needs logprobs: true", param="top_logprobs")
        return (top or 0) if body.logprobs else None
    n = body.logprobs
    if n is None or n is False:
        return None
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= MAX_TOP_LOGPROBS:
        raise bad_request(
            f"logprobs must be an integer 0..{MAX_TOP_LOGPROBS} (the alternatives per token)", param="logprobs"
        )
    return n


def _logit_bias(bias: dict[str, float], n_vocab: int) -> dict[int, float]:
    """OpenAI's logit_bias: token ids (as JSON object keys) to biases."""
    out = {}
    for key, value in bias.items():
        token = int(key) if key.isascii() and key.isdigit() else -1  # "²".isdigit() is true, int("²") fails
        if not 0 <= token < n_vocab:
            raise bad_request(f"logit_bias keys must be token ids 0..{n_vocab - 1}, got {key!r}", param="logit_bias")
        out[token] = value
    return out


def _fit_context(
    runtime: Runtime, n_prompt: int, requested: int | None, draft_len: int | str, param: str, prompt_param: str
) -> int:
    """``requested``, or all the room left when None; a 400 when the prompt and ``requested`` do not fit.

    The verify batch reaches γ tokens past the committed text, so the engine keeps its largest γ free (a fixed
    draft_len above it raises it).
    """
    n_ctx = runtime.context_size if runtime.draft is None else min(runtime.context_size, runtime.draft.n_ctx)
    headroom = max(runtime.engine.max_gamma, draft_len if isinstance(draft_len, int) else 0)
    room = n_ctx - n_prompt - headroom
    if requested is None:
        if room < 1:
            raise ApiError(
                400,
                f"the prompt ({n_prompt} tokens) leaves no room in the context of {n_ctx} tokens "
                f"({headroom} kept for drafts); shorten it, or start the server with a larger --n-ctx",
                param=prompt_param,
                code="context_length_exceeded",
            )
        return room
    if requested > room:
        raise ApiError(
            400,
            f"prompt ({n_prompt} tokens) + {param} ({requested}) + draft headroom ({headroom}) = "
            f"{n_prompt + requested + headroom} tokens exceeds the context of {n_ctx}; shorten the prompt, lower "
            f"{param}, or start the server with a larger --n-ctx",
            param=param,
            code="context_length_exceeded",
        )
    return requested
