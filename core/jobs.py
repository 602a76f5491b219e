"""The job file format: OpenAI Batch JSONL lines in, OpenAI Batch output lines out.

One input line is a chat request, a completions request, or the short prompt form:

    {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
     "body": {"model": "...", "messages": [...], "max_tokens": 64, "temperature": 0}}
    {"custom_id": "b", "method": "POST", "url": "/v1/completions",
     "body": {"model": "...", "prompt": "Once upon a time", "max_tokens": 16}}
    {"custom_id": "c", "prompt": "...", "max_tokens": 8}

`parse_job` checks every line and returns the valid requests and one `LineError` per bad
line; a bad line never stops the valid ones, whatever is wrong with it (bytes that are not
UTF-8, a line past the size limit, JSON nested too deep, a lone surrogate, a custom_id the
store cannot hold, a parameter out of range or not supported, a prompt the tokenizer cannot
encode). Only file-level limits (`JobTooLarge`: file size, number of requests) refuse a
whole file, before anything is stored. `run` and `submit` share it, so both report the same
codes and messages, on SQLite and PostgreSQL alike.

Every OpenAI body field is recognised. `ENGINE_SUPPORTED` lists the ones the engine honours
today; a recognised field outside it with a value other than its default is the per-line
error `unsupported_parameter` naming it (never silently ignored), and an unknown field is
`unknown_parameter`. Adding a field to `ENGINE_SUPPORTED` (once the engine honours it) is
the whole change here: `PARAMS` already validates and normalizes it into `JobRequest.params`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

CHAT_URL = "/v1/chat/completions"
COMPLETIONS_URL = "/v1/completions"
URLS = (CHAT_URL, COMPLETIONS_URL)
# `developer` is OpenAI's newer name for `system`; it is rendered as `system`.
ROLES = ("system", "developer", "user", "assistant")
CUSTOM_ID_MAX = 512  # the store's column width, the same on SQLite and PostgreSQL
MAX_DEPTH = 64  # nesting of arrays and objects in one line
MAX_STOP = 16

# Body fields that are pure format (they change nothing the engine does) or that the engine
# honours today. The lead adds a field here once the engine supports it.
ENGINE_SUPPORTED = frozenset(
    {
        "model",
        "messages",
        "prompt",
        "user",
        "metadata",
        "store",
        "service_tier",
        "max_tokens",
        "max_completion_tokens",
        "temperature",
        "top_p",
        "top_k",
        "seed",
        "stop",
        "n",
        "logprobs",
        "top_logprobs",
        "frequency_penalty",
        "presence_penalty",
        "logit_bias",
        "response_format",
    }
)
# Recognised body fields the engine may never take, with the values that mean "off".
OTHER_FIELDS: dict[str, tuple[Any, ...]] = {
    "stream": (None, False),
    "stream_options": (None,),
    "tools": (None, ()),
    "tool_choice": (None, "none", "auto"),
    "parallel_tool_calls": (None, True),
    "functions": (None, ()),
    "function_call": (None, "none", "auto"),
    "modalities": (None, ("text",)),
    "audio": (None,),
    "prediction": (None,),
    "reasoning_effort": (None,),
    "web_search_options": (None,),
    "echo": (None, False),
    "best_of": (None, 1),
    "suffix": (None, ""),
}
# Message fields besides role and content: recognised, not supported unless null.
MESSAGE_FIELDS = ("name", "tool_calls", "tool_call_id", "function_call", "refusal", "audio")


class _Bad(Exception):
    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class Param:
    """One generation parameter: its default and how a body value is checked.

    `check(value, url)` returns the normalized value or raises `_Bad`; `rule` is the
    sentence an error quotes.
    """

    default: Any
    rule: str
    check: Callable[[Any, str], Any]


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return (_is_int(v) or isinstance(v, float)) and math.isfinite(v)


def _accept(test: Callable[[Any], bool], convert: Callable[[Any], Any] = lambda v: v):
    def check(value: Any, _url: str) -> Any:
        if not test(value):
            raise ValueError
        return convert(value)

    return check


def _stop(value: Any, _url: str) -> list[str | list[int]]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or len(items) > MAX_STOP:
        raise ValueError
    out: list[str | list[int]] = []
    for s in items:
        if isinstance(s, str) and s:
            out.append(s)
        elif isinstance(s, list) and s and all(_is_int(t) and t >= 0 for t in s):
            out.append(list(s))
        else:
            raise ValueError
    return out


def _logprobs(value: Any, url: str) -> bool | int:
    # chat: a boolean; completions: how many alternatives (0-5) or null.
    if url == COMPLETIONS_URL:
        if _is_int(value) and 0 <= value <= 5:
            return value
        raise ValueError
    if isinstance(value, bool):
        return value
    raise ValueError


def _logit_bias(value: Any, _url: str) -> dict[str, float]:
    if not isinstance(value, dict):
        raise ValueError
    out = {}
    for k, v in value.items():
        if not (k.isdigit() and _is_num(v) and -100 <= v <= 100):
            raise ValueError
        out[str(int(k))] = float(v)
    return out


def _response_format(value: Any, _url: str) -> dict[str, Any] | None:
    if not isinstance(value, dict) or value.get("type") not in (
        "text",
        "json_object",
        "json_schema",
    ):
        raise ValueError
    if value["type"] == "json_schema" and not isinstance(value.get("json_schema"), dict):
        raise ValueError
    return None if value == {"type": "text"} else value


PARAMS: dict[str, Param] = {
    "max_tokens": Param(256, "a positive integer", _accept(lambda v: _is_int(v) and v > 0)),
    "temperature": Param(0.0, "a number >= 0", _accept(lambda v: _is_num(v) and v >= 0)),
    "top_p": Param(1.0, "a number in (0, 1]", _accept(lambda v: _is_num(v) and 0 < v <= 1)),
    "top_k": Param(0, "an integer >= 0", _accept(lambda v: _is_int(v) and v >= 0)),
    "seed": Param(
        None,
        "an integer from -2**63 to 2**64-1",
        _accept(lambda v: _is_int(v) and -(2**63) <= v < 2**64, lambda v: v % 2**64),
    ),
    "stop": Param([], f"a string or a list of up to {MAX_STOP} strings or token-id lists", _stop),
    "n": Param(1, "an integer from 1 to 128", _accept(lambda v: _is_int(v) and 1 <= v <= 128)),
    "logprobs": Param(False, "true/false (chat) or an integer 0-5 (completions)", _logprobs),
    "top_logprobs": Param(
        0, "an integer from 0 to 20", _accept(lambda v: _is_int(v) and 0 <= v <= 20)
    ),
    "frequency_penalty": Param(
        0.0, "a number in [-2, 2]", _accept(lambda v: _is_num(v) and -2 <= v <= 2, float)
    ),
    "presence_penalty": Param(
        0.0, "a number in [-2, 2]", _accept(lambda v: _is_num(v) and -2 <= v <= 2, float)
    ),
    "logit_bias": Param({}, "an object of token ids to numbers in [-100, 100]", _logit_bias),
    "response_format": Param(
        None,
        'an object with "type" text, json_object or json_schema (with "json_schema")',
        _response_format,
    ),
}
DEFAULT_PARAMS: dict[str, Any] = {name: p.default for name, p in PARAMS.items()}
# What the command line may override (`--max-tokens` ...).
OVERRIDES = ("max_tokens", "temperature", "top_p", "seed")


@dataclass(frozen=True)
class JobLimits:
    """Limits on one job file (core.settings.Settings.job_limits reads them from the env).

    Attributes:
        line_bytes: the longest line (bytes); longer lines are per-line errors.
        lines: the most non-blank lines (requests) in one file.
        file_bytes: the largest file (bytes).
        max_tokens: the largest max_tokens a request may ask for.
    """

    line_bytes: int = 1 << 20
    lines: int = 50_000
    file_bytes: int = 200 * (1 << 20)
    max_tokens: int = 32_768


class JobTooLarge(ValueError):
    """A whole file past a limit (its size, its number of requests): nothing is stored."""


@dataclass(frozen=True)
class LongLine:
    """A line past the size limit, read no further than the limit (its bytes are dropped)."""

    size: int


@dataclass
class JobRequest:
    """One valid input line, with its effective generation parameters.

    Attributes:
        line: 1-based line number in the input file.
        custom_id: the caller's id, unique within the job.
        messages: chat messages (`{"role", "content"}`, content as one string), or None.
        prompt: the raw completion prompt, or None for a chat request.
        params: every PARAMS entry, defaults < body < overrides, normalized.
        url: the endpoint the line asked for: CHAT_URL (also the short prompt form, which
            answers with a chat.completion) or COMPLETIONS_URL (a text_completion).
    """

    line: int
    custom_id: str
    messages: list[dict[str, str]] | None = None
    prompt: str | None = None
    params: dict[str, Any] = field(default_factory=lambda: dict(DEFAULT_PARAMS))
    url: str = CHAT_URL

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobRequest:
        keys = ("line", "custom_id", "messages", "prompt", "params")
        return cls(**{k: data[k] for k in keys}, url=data.get("url", CHAT_URL))


@dataclass
class LineError:
    """A bad input line: `message` always names the line number."""

    line: int
    custom_id: str | None
    code: str
    message: str

    def to_error(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message}


def parse_job(
    lines: Iterable[str | bytes | LongLine],
    *,
    model_names: Iterable[str] = (),
    overrides: Mapping[str, Any] | None = None,
    count_tokens: Callable[[JobRequest], int] | None = None,
    context_length: int | None = None,
    limits: JobLimits | None = None,
    aliases: Mapping[str, str] | None = None,
    strict_models: bool = False,
    check_format: Callable[[dict[str, Any]], None] | None = None,
) -> tuple[list[JobRequest], list[LineError]]:
    """Validate a job file's lines, one at a time (the input may be a stream).

    Args:
        lines: the file's lines, as text, as raw bytes (decoded here, per line) or as
            `LongLine` markers from `iter_job_file`; blank lines are skipped.
        model_names: names the job's model answers to; empty means any name is the job's.
        overrides: generation parameters from the command line; non-None values win over
            the body's.
        count_tokens: the prompt's token count for a request (needs the tokenizer); with
            `context_length`, a prompt that leaves no room to generate is an error, and a
            request the tokenizer cannot encode is a per-line error.
        context_length: the model's context length.
        limits: line size, request count and max_tokens limits (defaults: JobLimits()).
        aliases: names (OpenAI model names) -> the model spec they stand for on this farm.
            A body naming an alias of another model than the job's is `model_not_found`.
        strict_models: a body "model" that is none of `model_names` (nor an alias of them)
            is `model_not_found`; otherwise it runs on the job's model.
        check_format: raises ValueError naming what is unsupported in a `response_format`
            (compiles its grammar: needs the tokenizer); the line's error is then
            `invalid_response_format`.

    Returns:
        The valid requests in file order, and one LineError per bad line.

    Raises:
        JobTooLarge: more than `limits.lines` requests.
        ValueError: a bad override (the message names the option).
    """
    limits = limits or JobLimits()
    names = set(model_names)
    clean_overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
    _check_overrides(clean_overrides, limits)
    context = _Context(names, dict(aliases or {}), strict_models, clean_overrides, limits)
    requests: list[JobRequest] = []
    errors: list[LineError] = []
    first_line: dict[str, int] = {}
    seen = 0
    for number, raw in enumerate(lines, start=1):
        if not isinstance(raw, LongLine) and not raw.strip():
            continue
        seen += 1
        if seen > limits.lines:
            raise JobTooLarge(
                f"more than {limits.lines} requests in one job (APPLESPEC_MAX_LINES); "
                "split the file into several jobs"
            )
        custom_id = None
        try:
            obj = _decode(raw, number, limits)
            custom_id = _custom_id(obj)
            if custom_id in first_line:
                raise _Bad(
                    "duplicate_custom_id",
                    f"duplicate custom_id {_show(custom_id)} "
                    f"(first used on line {first_line[custom_id]})",
                )
            first_line[custom_id] = number
            request = _parse_request(number, custom_id, obj, context)
            if count_tokens is not None:
                _check_tokens(request, count_tokens, context_length)
            if check_format is not None and request.params.get("response_format"):
                _check_format(request, check_format)
            requests.append(request)
        except _Bad as bad:
            errors.append(LineError(number, custom_id, bad.code, f"line {number}: {bad.message}"))
        except Exception as e:  # a check of ours that broke: this line fails, the job goes on
            errors.append(
                LineError(
                    number,
                    custom_id,
                    "validation_error",
                    f"line {number}: could not be validated ({type(e).__name__}: {_clip(str(e))})",
                )
            )
    return requests, errors


@dataclass
class _Context:
    names: set[str]
    aliases: dict[str, str]
    strict: bool
    overrides: dict[str, Any]
    limits: JobLimits


def _decode(raw: str | bytes | LongLine, number: int, limits: JobLimits) -> dict[str, Any]:
    """One line as a JSON object: size, encoding, JSON, nesting and Unicode checked."""
    if isinstance(raw, LongLine):
        raise _too_long(raw.size, limits)
    if isinstance(raw, bytes):
        if len(raw) > limits.line_bytes:
            raise _too_long(len(raw), limits)
        if number == 1 and raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]  # a UTF-8 byte order mark
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise _Bad(
                "invalid_encoding",
                f"not UTF-8 text (byte 0x{raw[e.start]:02x} at byte {e.start + 1} of the line)",
            ) from None
    else:
        text = raw
        if len(text) * 4 > limits.line_bytes and len(text.encode("utf-8", "surrogatepass")) > (
            limits.line_bytes
        ):
            raise _too_long(len(text.encode("utf-8", "surrogatepass")), limits)
    try:
        obj = _DECODER.decode(text)
    except json.JSONDecodeError as e:
        raise _Bad("invalid_json", f"invalid JSON: {e.msg} (column {e.colno})") from None
    except RecursionError:
        raise _Bad("too_deep", f"JSON nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as e:  # NaN/Infinity, integers of thousands of digits
        raise _Bad("invalid_json", f"invalid JSON: {_clip(str(e))}") from None
    # The walk only when the text allows a problem: enough brackets to nest that deep, or a
    # surrogate (escaped, or in a str line given directly).
    deep = text.count("[") + text.count("{") > MAX_DEPTH
    if deep or _SURROGATE_ESCAPE.search(text) or not _valid_text(text):
        _check_tree(obj)
    if not isinstance(obj, dict):
        raise _Bad("invalid_request", f"expected a JSON object, got {_kind(obj)}")
    return obj


def _too_long(size: int, limits: JobLimits) -> _Bad:
    return _Bad(
        "line_too_long",
        f"the line has {size} bytes, above the limit of {limits.line_bytes} "
        "(APPLESPEC_MAX_LINE_BYTES)",
    )


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


_DECODER = json.JSONDecoder(parse_constant=_no_constant)
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _check_tree(obj: Any) -> None:
    """Nesting depth and valid Unicode (no lone surrogates) everywhere in a parsed line."""
    stack: list[tuple[Any, int]] = [(obj, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, str):
            if not _valid_text(value):
                _raise_bad_text(obj)
        elif isinstance(value, dict | list):
            if depth > MAX_DEPTH:
                raise _Bad("too_deep", f"JSON nested deeper than {MAX_DEPTH} levels")
            if isinstance(value, dict):
                for k, v in value.items():
                    if not _valid_text(k):
                        _raise_bad_text(obj)
                    stack.append((v, depth + 1))
            else:
                stack.extend((v, depth + 1) for v in value)


def _valid_text(s: str) -> bool:
    if s.isascii():
        return True
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _raise_bad_text(obj: Any) -> None:
    """Find where the lone surrogate is (a second, slower walk) and say so."""
    stack: list[tuple[Any, str]] = [(obj, "")]
    while stack:
        value, path = stack.pop()
        texts = [(value, path)] if isinstance(value, str) else []
        if isinstance(value, dict):
            for k, v in value.items():
                where = f"{path}.{k}" if path else k
                texts.append((k, where))
                stack.append((v, where))
        elif isinstance(value, list):
            stack.extend((v, f"{path}[{i}]") for i, v in enumerate(value))
        for text, where in texts:
            if not _valid_text(text):
                bad = next(c for c in text if 0xD800 <= ord(c) <= 0xDFFF)
                at = f" in {_clip(_show(where, quote=False), 60)}" if where else ""
                raise _Bad(
                    "invalid_text", f"a lone surrogate ({bad!r}){at} is not valid Unicode text"
                )


def _custom_id(obj: dict[str, Any]) -> str:
    custom_id = obj.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        raise _Bad("missing_custom_id", "missing custom_id (a non-empty string)")
    if len(custom_id) > CUSTOM_ID_MAX:
        raise _Bad(
            "invalid_custom_id",
            f"custom_id has {len(custom_id)} characters; the limit is {CUSTOM_ID_MAX}",
        )
    if "\x00" in custom_id:
        raise _Bad("invalid_custom_id", "custom_id contains a NUL character (\\u0000)")
    return custom_id


def _parse_request(number: int, custom_id: str, obj: dict[str, Any], ctx: _Context) -> JobRequest:
    if "body" not in obj and "prompt" in obj:  # the short form: body fields beside the prompt
        url = CHAT_URL
        body = {k: v for k, v in obj.items() if k != "custom_id"}
        where = ""
        if "messages" in body:
            raise _Bad("unknown_parameter", "messages is not a field of a prompt line")
        prompt, messages = _check_prompt(body.pop("prompt"), where), None
    else:
        for key in obj:
            if key not in ("custom_id", "method", "url", "body"):
                raise _Bad("unknown_parameter", f"unknown field {_show(key)} in the line")
        method = obj.get("method")
        if method != "POST":
            raise _Bad("invalid_method", f'method must be "POST", got {_show(method)}')
        url = obj.get("url")
        if url not in URLS:
            raise _Bad(
                "invalid_url", f"url must be {CHAT_URL!r} or {COMPLETIONS_URL!r}, got {_show(url)}"
            )
        body = obj.get("body")
        if not isinstance(body, dict):
            raise _Bad("invalid_request", f"body must be a JSON object, got {_kind(body)}")
        body = dict(body)
        where = "body."
        if url == CHAT_URL:
            if "prompt" in body:
                raise _Bad("unknown_parameter", f"body.prompt is not a {CHAT_URL} parameter")
            messages, prompt = _check_messages(body.pop("messages", None)), None
        else:
            if "messages" in body:
                raise _Bad(
                    "unknown_parameter", f"body.messages is not a {COMPLETIONS_URL} parameter"
                )
            messages, prompt = None, _check_prompt(body.pop("prompt", None), where)
    _check_model(body.get("model"), where, ctx)
    params = _check_body(body, url, where, ctx)
    return JobRequest(number, custom_id, messages, prompt, params, url)


def _check_model(model: Any, where: str, ctx: _Context) -> None:
    if model in (None, ""):
        return
    if not isinstance(model, str):
        raise _Bad("invalid_request", f"{where}model must be a string, got {_kind(model)}")
    if not ctx.names or model in ctx.names:
        return
    job = ", ".join(sorted(ctx.names))
    if model in ctx.aliases:
        if ctx.aliases[model] in ctx.names:
            return
        raise _Bad(
            "model_not_found",
            f"model {_show(model)} is {ctx.aliases[model]} on this farm "
            f"(APPLESPEC_MODEL_ALIASES), but this job runs {job}",
        )
    if ctx.strict:
        raise _Bad("model_not_found", f"unknown model {_show(model)} (this job runs {job})")


def _check_body(body: dict[str, Any], url: str, where: str, ctx: _Context) -> dict[str, Any]:
    """The request's params: each body field validated, unsupported non-defaults refused."""
    given: dict[str, Any] = {}
    for name, value in body.items():
        if name == "max_completion_tokens":  # OpenAI's newer name for max_tokens
            name = "max_tokens"
            if (
                value is not None
                and "max_tokens" in body
                and body["max_tokens"] not in (None, value)
            ):
                raise _Bad(
                    "invalid_parameter",
                    f"{where}max_tokens and {where}max_completion_tokens disagree",
                )
        if name in PARAMS:
            if value is None:
                continue
            param = PARAMS[name]
            try:
                value = param.check(value, url)
            except (ValueError, TypeError, AttributeError):
                raise _Bad(
                    "invalid_parameter",
                    f"{where}{name} must be {param.rule}, got {_show(value)}",
                ) from None
            given[name] = value
        elif name in OTHER_FIELDS:
            if _off(value, OTHER_FIELDS[name]):
                continue
            raise _unsupported(f"{where}{name}")
        elif name not in ENGINE_SUPPORTED:
            raise _Bad(
                "unknown_parameter", f"{_show(where + name, quote=False)} is not a known parameter"
            )
    if url == COMPLETIONS_URL and "logprobs" in given:
        # completions: logprobs=k asks for the chosen token's log-probability and k others.
        k = given.pop("logprobs")
        given["logprobs"], given["top_logprobs"] = True, k
    if given.get("top_logprobs") and not given.get("logprobs"):
        raise _Bad("invalid_parameter", f"{where}top_logprobs needs {where}logprobs: true")
    params = {**DEFAULT_PARAMS, **given, **ctx.overrides}
    for name, value in params.items():
        if name not in ENGINE_SUPPORTED and value != PARAMS[name].default:
            raise _unsupported(f"{where}{name}")
    if params["max_tokens"] > ctx.limits.max_tokens:
        raise _Bad(
            "invalid_parameter",
            f"{where}max_tokens is {params['max_tokens']}, above this farm's limit of "
            f"{ctx.limits.max_tokens} (APPLESPEC_MAX_TOKENS_LIMIT)",
        )
    return params


def _off(value: Any, defaults: tuple[Any, ...]) -> bool:
    """Whether a recognised field's value is one of the values that mean "off"."""
    value = tuple(value) if isinstance(value, list) else value
    return any(value == d and type(value) is type(d) for d in defaults)


def _unsupported(name: str) -> _Bad:
    return _Bad(
        "unsupported_parameter",
        f"{name} is not supported by this farm's engine yet; remove it or leave it at its default",
    )


def _check_prompt(prompt: Any, where: str) -> str:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, list):
        if prompt and all(_is_int(t) for t in prompt):
            raise _unsupported(f"{where}prompt as token ids")
        raise _unsupported(f"{where}prompt as an array of several prompts (one prompt per line)")
    if not isinstance(prompt, str) or not prompt:
        raise _Bad("invalid_prompt", f"{where}prompt must be a non-empty string")
    return prompt


def _check_messages(messages: Any) -> list[dict[str, str]]:
    if not isinstance(messages, list) or not messages:
        raise _Bad("invalid_messages", "body.messages must be a non-empty list")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise _Bad("invalid_messages", f"messages[{i}] must be an object, got {_kind(m)}")
        role = m.get("role")
        if role not in ROLES:
            raise _Bad(
                "invalid_role",
                f"messages[{i}].role must be one of {', '.join(ROLES)}, got {_show(role)}",
            )
        for key, value in m.items():
            if key in ("role", "content"):
                continue
            if key in MESSAGE_FIELDS:
                if value not in (None, "", []):
                    raise _unsupported(f"messages[{i}].{key}")
            else:
                raise _Bad("invalid_messages", f"messages[{i}] has an unknown field {_show(key)}")
        out.append({"role": "system" if role == "developer" else role, "content": _content(m, i)})
    return out


def _content(m: dict[str, Any], i: int) -> str:
    """A message's content as one string; an array of text parts is joined by newlines."""
    content = m.get("content")
    if isinstance(content, str):
        return content
    if not isinstance(content, list) or not content:
        raise _Bad(
            "invalid_messages",
            f"messages[{i}].content must be a string or a non-empty array of text parts",
        )
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind == "text" and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif isinstance(kind, str) and kind != "text":
            raise _unsupported(f"messages[{i}].content[{j}] of type {_show(kind)} (text only)")
        else:
            raise _Bad(
                "invalid_messages",
                f'messages[{i}].content[{j}] must be {{"type": "text", "text": "..."}}',
            )
    return "\n".join(texts)


def _check_tokens(
    request: JobRequest, count_tokens: Callable[[JobRequest], int], context_length: int | None
) -> None:
    try:
        n = count_tokens(request)
    except Exception as e:  # templates raise on what they refuse (role order, ...)
        code = (
            "chat_template_error" if type(e).__module__.startswith("jinja2") else "tokenizer_error"
        )
        raise _Bad(
            code,
            f"the model's tokenizer cannot encode this request ({type(e).__name__}: {_clip(str(e))})",
        ) from None
    if context_length is not None and n >= context_length:
        raise _Bad(
            "context_length_exceeded",
            f"prompt is {n} tokens, which leaves no room in the model's "
            f"context of {context_length} tokens",
        )


def _check_format(request: JobRequest, check: Callable[[dict[str, Any]], None]) -> None:
    try:
        check(request.params["response_format"])
    except ValueError as e:
        raise _Bad(
            "invalid_response_format",
            f"response_format cannot be followed: {_clip(str(e), 300)}",
        ) from None


def _check_overrides(overrides: Mapping[str, Any], limits: JobLimits) -> None:
    """Raise ValueError, naming the option, for an out-of-range command-line override."""
    for name, value in overrides.items():
        if name not in OVERRIDES:
            raise ValueError(f"{name} cannot be set from the command line")
        label = f"--{name.replace('_', '-')}"
        try:
            PARAMS[name].check(value, CHAT_URL)
        except (ValueError, TypeError):
            raise ValueError(f"{label} must be {PARAMS[name].rule}, got {value!r}") from None
        if name == "max_tokens" and value > limits.max_tokens:
            raise ValueError(
                f"{label} is {value}, above this farm's limit of {limits.max_tokens} "
                "(APPLESPEC_MAX_TOKENS_LIMIT)"
            )


def _kind(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", type(None): "null"}.get(
        type(value), type(value).__name__
    )


def _clip(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def _show(value: Any, quote: bool = True) -> str:
    """A user's value in a message: repr (escapes NUL and surrogates), at most ~80 chars."""
    text = repr(value) if quote else value.encode("unicode_escape").decode("ascii")
    return text if len(text) <= 80 else text[:77] + "..."


def iter_job_file(
    path: str | os.PathLike, limits: JobLimits | None = None
) -> Iterator[bytes | LongLine]:
    """A job file's lines as raw bytes, streamed: nothing longer than the line limit is held.

    The size limit is checked and the file opened now; lines are read as the result is
    iterated. A line past `limits.line_bytes` comes out as a `LongLine` (its size) and is
    skipped in 64 KiB reads. Decoding happens per line in `parse_job`, so bytes that are not
    UTF-8 make one line bad, not the file.

    Raises:
        JobTooLarge: the file is larger than `limits.file_bytes`.
        OSError: the file cannot be read.
    """
    limits = limits or JobLimits()
    size = os.path.getsize(path)
    if size > limits.file_bytes:
        raise JobTooLarge(
            f"{os.fspath(path)} has {size} bytes, above the limit of {limits.file_bytes} "
            "(APPLESPEC_MAX_FILE_BYTES); split it into several jobs"
        )
    return stream_job_lines(open(path, "rb"), limits.line_bytes)  # noqa: SIM115 - closed by it


def stream_job_lines(f: Any, limit: int) -> Iterator[bytes | LongLine]:
    """The lines of a binary stream `f` as raw bytes, a `LongLine` for each past `limit` bytes.

    Every entry point splits job files here (a path in `iter_job_file`, an HTTP upload in
    core.store.files), so each gets the same per-line checks from `parse_job`. Closes `f`
    once the lines are exhausted.
    """
    with f:
        while line := f.readline(limit + 2):  # + "\r\n"
            if len(line) <= limit or line.endswith(b"\n"):
                stripped = line.rstrip(b"\r\n")
                yield stripped if len(stripped) <= limit else LongLine(len(stripped))
                continue
            n = len(line)
            while not line.endswith(b"\n"):
                line = f.readline(1 << 16)
                if not line:
                    break
                n += len(line)
            yield LongLine(n - (len(line) - len(line.rstrip(b"\r\n"))))


def output_line(
    job_id: str,
    line: int,
    custom_id: str | None,
    *,
    body: dict[str, Any] | None = None,
    error: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """One OpenAI Batch output line: a 200 response with `body`, or an `error`.

    Its ids derive from the job and the input line, so `run`'s output and a later
    `applespec results` of the same job are identical.
    """
    key = f"{job_id.removeprefix('batch_')}_{line}"
    if error is not None:
        return {
            "id": f"batch_req_{key}",
            "custom_id": custom_id,
            "response": None,
            "error": dict(error),
        }
    return {
        "id": f"batch_req_{key}",
        "custom_id": custom_id,
        "response": {"status_code": 200, "request_id": f"req_{key}", "body": body},
        "error": None,
    }


def completion_body(
    model: str, result: Any, *, created: int | None = None, request: JobRequest | None = None
) -> dict[str, Any]:
    """The response object for an engine GenerationResult, with its metrics.

    A chat.completion, or a text_completion for a `/v1/completions` request; `model` is the
    model that ran (whatever name the line's body used). One choice per answer (`n`), with
    OpenAI's `logprobs` objects when they were asked for.
    """
    completions = request is not None and request.url == COMPLETIONS_URL
    choices = getattr(result, "choices", None) or [result]
    out = []
    for i, c in enumerate(choices):
        lp = getattr(c, "logprobs", None)
        if completions:
            choice = {"text": c.text, "index": i, "logprobs": _completion_logprobs(lp)}
        else:
            choice = {"index": i, "message": {"role": "assistant", "content": c.text}}
            choice["logprobs"] = _chat_logprobs(lp)
        out.append({**choice, "finish_reason": c.finish_reason})
    head = (
        {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion"}
        if completions
        else {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion"}
    )
    completion = sum(len(c.tokens) for c in choices)
    return {
        **head,
        "created": int(time.time()) if created is None else created,
        "model": model,
        "choices": out,
        "usage": {
            "prompt_tokens": result.prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": result.prompt_tokens + completion,
        },
        "speculative": dict(result.speculative),
        "timing": dict(result.timing),
    }


def _token_bytes(token: str) -> list[int]:
    return list(token.encode("utf-8", "surrogatepass"))


def _chat_logprobs(records: list[dict] | None) -> dict[str, Any] | None:
    """OpenAI chat `logprobs`: {"content": [{"token", "logprob", "bytes", "top_logprobs"}]}."""
    if records is None:
        return None
    return {
        "content": [
            {
                "token": r["token"],
                "logprob": r["logprob"],
                "bytes": _token_bytes(r["token"]),
                "top_logprobs": [
                    {
                        "token": t["token"],
                        "logprob": t["logprob"],
                        "bytes": _token_bytes(t["token"]),
                    }
                    for t in r["top_logprobs"]
                ],
            }
            for r in records
        ]
    }


def _completion_logprobs(records: list[dict] | None) -> dict[str, Any] | None:
    """OpenAI completions `logprobs`: tokens, token_logprobs, top_logprobs, text_offset."""
    if records is None:
        return None
    offsets, at = [], 0
    for r in records:
        offsets.append(at)
        at += len(r["token"])
    return {
        "tokens": [r["token"] for r in records],
        "token_logprobs": [r["logprob"] for r in records],
        "top_logprobs": [{t["token"]: t["logprob"] for t in r["top_logprobs"]} for r in records],
        "text_offset": offsets,
    }


def model_names(spec: str, target: Any) -> set[str]:
    """The names a job line's body "model" may use for this target: its spec, name, aliases."""
    return {spec, target.name, *target.info.get("aliases", ())}


def prompt_tokens(target: Any, request: JobRequest) -> list[int]:
    """The prompt token ids of a request, as the engine will see them."""
    if request.messages is not None:
        return target.encode_chat(request.messages)
    return target.encode_prompt(request.prompt)


def tokenizer_target(spec: str) -> Any:
    """A LoadedModel without weights for `spec` (its tokenizer and context length only):
    enough to validate a job exactly as the engine will encode it, without loading the model.

    Raises:
        ModelError: the model's files cannot be found or read.
    """
    from core.models.loading import load_tokenizer
    from core.models.model import LoadedModel

    tokenizer, context_length = load_tokenizer(spec)
    return LoadedModel(
        name=spec,
        model=None,
        tokenizer=tokenizer,
        context_length=context_length,
        info={"source": "tokenizer"},
    )


def validate_for(
    lines: Iterable[str | bytes | LongLine],
    spec: str,
    target: Any,
    overrides: Mapping[str, Any] | None = None,
    **options: Any,
) -> tuple[list[JobRequest], list[LineError]]:
    """parse_job for a target (loaded, or a `tokenizer_target`): its names, its tokenizer
    and its context length; `options` are parse_job's (limits, aliases, strict_models)."""
    return parse_job(
        lines,
        model_names=model_names(spec, target),
        overrides=overrides,
        count_tokens=lambda r: len(prompt_tokens(target, r)),
        context_length=target.context_length,
        check_format=lambda rf: _grammar_check(rf, target),
        **options,
    )


def _grammar_check(response_format: dict[str, Any], target: Any) -> None:
    from core.engine.grammar import check_format

    check_format(response_format, target.tokenizer)


def generation_params(request: JobRequest) -> Any:
    """The engine's GenerationParams for a request.

    Parameters at their defaults that GenerationParams does not know yet are left out;
    one it does not know with another value is an error (never dropped silently).
    """
    from core.engine import GenerationParams

    known = {f.name for f in dataclasses.fields(GenerationParams)}
    params = {}
    for name, value in request.params.items():
        if name in known:
            params[name] = value
        elif name in PARAMS and value != PARAMS[name].default:
            raise ValueError(f"the engine does not take {name!r} yet")
    return GenerationParams(**params)


def run_request(engine: Any, request: JobRequest) -> Any:
    """Generate one request alone with a core.engine Engine; returns its GenerationResult."""
    return engine.generate(prompt_tokens(engine.target, request), generation_params(request))
