"""The job file format: OpenAI Batch JSONL lines in, OpenAI Batch output lines out.

One input line is either a chat request

    {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
     "body": {"model": "...", "messages": [...], "max_tokens": 64, "temperature": 0,
              "top_p": 1, "top_k": 0, "seed": 1}}

or a raw completion prompt `{"custom_id": "a", "prompt": "..."}`. `parse_job` checks every
line and returns the valid requests and one `LineError` per bad line; a bad line never stops
the valid ones. `run` and `submit` share it, so both report the same codes and messages.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

CHAT_URL = "/v1/chat/completions"
ROLES = ("system", "user", "assistant")
PARAM_NAMES = ("max_tokens", "temperature", "top_p", "top_k", "seed")
DEFAULT_PARAMS: dict[str, Any] = {
    "max_tokens": 256,
    "temperature": 0.0,
    "top_p": 1.0,
    "top_k": 0,
    "seed": None,
}


@dataclass
class JobRequest:
    """One valid input line, with its effective generation parameters.

    Attributes:
        line: 1-based line number in the input file.
        custom_id: the caller's id, unique within the job.
        messages: chat messages (`{"role", "content"}`), or None for a raw prompt.
        prompt: the raw completion prompt, or None for a chat request.
        params: max_tokens, temperature, top_p, top_k, seed after defaults < body < overrides.
    """

    line: int
    custom_id: str
    messages: list[dict[str, str]] | None = None
    prompt: str | None = None
    params: dict[str, Any] = field(default_factory=lambda: dict(DEFAULT_PARAMS))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> JobRequest:
        return cls(**{k: data[k] for k in ("line", "custom_id", "messages", "prompt", "params")})


@dataclass
class LineError:
    """A bad input line: `message` always names the line number."""

    line: int
    custom_id: str | None
    code: str
    message: str

    def to_error(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message}


class _Bad(Exception):
    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


def parse_job(
    lines: Iterable[str],
    *,
    model_names: Iterable[str] = (),
    overrides: Mapping[str, Any] | None = None,
    count_tokens: Callable[[JobRequest], int] | None = None,
    context_length: int | None = None,
) -> tuple[list[JobRequest], list[LineError]]:
    """Validate a job file's lines.

    Args:
        lines: the file's lines (with or without newlines); blank lines are skipped.
        model_names: names the loaded model answers to; a body "model" that is non-empty and
            not one of them is an error. Empty means any model name is accepted.
        overrides: generation parameters from the command line; non-None values win over
            the body's.
        count_tokens: the prompt's token count for a request (needs the tokenizer); with
            `context_length`, a prompt that leaves no room to generate is an error.
        context_length: the model's context length.

    Returns:
        The valid requests in file order, and one LineError per bad line.
    """
    names = set(model_names)
    clean_overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
    _check_params(clean_overrides, where="option")
    requests: list[JobRequest] = []
    errors: list[LineError] = []
    first_line: dict[str, int] = {}
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        custom_id = None
        try:
            try:
                obj = json.loads(raw)
            except json.JSONDecodeError as e:
                raise _Bad("invalid_json", f"invalid JSON: {e.msg} (column {e.colno})") from e
            if not isinstance(obj, dict):
                raise _Bad("invalid_request", f"expected a JSON object, got {_kind(obj)}")
            custom_id = obj.get("custom_id")
            if not isinstance(custom_id, str) or not custom_id:
                custom_id = None
                raise _Bad("missing_custom_id", "missing custom_id (a non-empty string)")
            if custom_id in first_line:
                raise _Bad(
                    "duplicate_custom_id",
                    f"duplicate custom_id {custom_id!r} (first used on line {first_line[custom_id]})",
                )
            first_line[custom_id] = number
            request = _parse_request(number, custom_id, obj, names, clean_overrides)
            if count_tokens is not None and context_length is not None:
                n = count_tokens(request)
                if n >= context_length:
                    raise _Bad(
                        "context_length_exceeded",
                        f"prompt is {n} tokens, which leaves no room in the model's "
                        f"context of {context_length} tokens",
                    )
            requests.append(request)
        except _Bad as bad:
            errors.append(LineError(number, custom_id, bad.code, f"line {number}: {bad.message}"))
    return requests, errors


def _parse_request(
    number: int,
    custom_id: str,
    obj: dict[str, Any],
    names: set[str],
    overrides: dict[str, Any],
) -> JobRequest:
    if "prompt" in obj and "body" not in obj:
        prompt = obj["prompt"]
        if not isinstance(prompt, str) or not prompt:
            raise _Bad("invalid_prompt", "prompt must be a non-empty string")
        body: dict[str, Any] = {k: obj[k] for k in (*PARAM_NAMES, "model") if k in obj}
        messages = None
    else:
        method = obj.get("method")
        if method != "POST":
            raise _Bad("invalid_method", f'method must be "POST", got {method!r}')
        url = obj.get("url")
        if url != CHAT_URL:
            raise _Bad("invalid_url", f"url must be {CHAT_URL!r}, got {url!r}")
        body = obj.get("body")
        if not isinstance(body, dict):
            raise _Bad("invalid_request", f"body must be a JSON object, got {_kind(body)}")
        messages = _check_messages(body.get("messages"))
        prompt = None
    model = body.get("model")
    if model not in (None, "") and names and model not in names:
        known = ", ".join(sorted(names))
        raise _Bad("model_not_found", f"unknown model {model!r} (this job runs {known})")
    body_params = {k: body[k] for k in PARAM_NAMES if k in body and body[k] is not None}
    _check_params(body_params, where="body")
    params = {**DEFAULT_PARAMS, **body_params, **overrides}
    return JobRequest(number, custom_id, messages, prompt, params)


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
                f"messages[{i}].role must be one of {', '.join(ROLES)}, got {role!r}",
            )
        if not isinstance(m.get("content"), str):
            raise _Bad("invalid_messages", f"messages[{i}].content must be a string")
        out.append({"role": role, "content": m["content"]})
    return out


def _check_params(params: Mapping[str, Any], *, where: str) -> None:
    """Raise _Bad for the first out-of-range generation parameter."""
    for name, value in params.items():
        is_int = isinstance(value, int) and not isinstance(value, bool)
        is_num = (is_int or isinstance(value, float)) and value == value  # not NaN
        ok = {
            "max_tokens": is_int and value > 0,
            "temperature": is_num and value >= 0,
            "top_p": is_num and 0 < value <= 1,
            "top_k": is_int and value >= 0,
            "seed": is_int,
        }[name]
        if not ok:
            rule = {
                "max_tokens": "a positive integer",
                "temperature": "a number >= 0",
                "top_p": "a number in (0, 1]",
                "top_k": "an integer >= 0",
                "seed": "an integer",
            }[name]
            label = f"{where}.{name}" if where == "body" else f"--{name.replace('_', '-')}"
            if where == "option":
                raise ValueError(f"{label} must be {rule}, got {value!r}")
            raise _Bad("invalid_parameter", f"{label} must be {rule}, got {value!r}")


def _kind(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", type(None): "null"}.get(
        type(value), type(value).__name__
    )


def read_lines(path: str) -> list[str]:
    """The lines of a job file (UTF-8)."""
    with open(path, encoding="utf-8") as f:
        return f.read().splitlines()


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


def completion_body(model: str, result: Any, *, created: int | None = None) -> dict[str, Any]:
    """A chat.completion object for an engine GenerationResult, with its metrics."""
    completion = len(result.tokens)
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()) if created is None else created,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": result.text},
                "finish_reason": result.finish_reason,
            }
        ],
        "usage": {
            "prompt_tokens": result.prompt_tokens,
            "completion_tokens": completion,
            "total_tokens": result.prompt_tokens + completion,
        },
        "speculative": dict(result.speculative),
        "timing": dict(result.timing),
    }


def model_names(spec: str, target: Any) -> set[str]:
    """The names a job line's body "model" may use for this target: its spec, name, aliases."""
    return {spec, target.name, *target.info.get("aliases", ())}


def prompt_tokens(target: Any, request: JobRequest) -> list[int]:
    """The prompt token ids of a request, as the engine will see them."""
    if request.messages is not None:
        return target.encode_chat(request.messages)
    return target.encode_prompt(request.prompt)


def validate_for(
    lines: Iterable[str],
    spec: str,
    target: Any,
    overrides: Mapping[str, Any] | None = None,
    *,
    any_model_name: bool = False,
) -> tuple[list[JobRequest], list[LineError]]:
    """parse_job for a loaded target: its names, its tokenizer and its context length.

    With `any_model_name`, a line's body "model" is not checked (the HTTP API runs lines
    naming a model the farm does not serve on its default model).
    """
    return parse_job(
        lines,
        model_names=() if any_model_name else model_names(spec, target),
        overrides=overrides,
        count_tokens=lambda r: len(prompt_tokens(target, r)),
        context_length=target.context_length,
    )


def run_request(engine: Any, request: JobRequest) -> Any:
    """Generate one request with a core.engine Engine; returns its GenerationResult."""
    from core.engine import GenerationParams

    params = GenerationParams(**request.params)
    return engine.generate(prompt_tokens(engine.target, request), params)
