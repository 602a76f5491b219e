"""The job file format: every bad-line class, overrides, limits, OpenAI compatibility, and
the output line shape."""

import json
import tracemalloc

import pytest

from core import jobs
from core.jobs import (
    DEFAULT_PARAMS,
    ENGINE_SUPPORTED,
    OTHER_FIELDS,
    PARAMS,
    JobLimits,
    JobRequest,
    JobTooLarge,
    LongLine,
    completion_body,
    iter_job_file,
    output_line,
    parse_job,
    run_request,
)


def chat(custom_id="a", **body):
    body.setdefault("messages", [{"role": "user", "content": "hi"}])
    return json.dumps(
        {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}
    )


BAD_LINES = [
    ("{not json", "invalid_json", "invalid JSON"),
    ("[1, 2]", "invalid_request", "expected a JSON object, got an array"),
    (json.dumps({"prompt": "x"}), "missing_custom_id", "missing custom_id"),
    (json.dumps({"custom_id": 7, "prompt": "x"}), "missing_custom_id", "missing custom_id"),
    (chat(messages=[]), "invalid_messages", "non-empty list"),
    (chat(messages="hi"), "invalid_messages", "non-empty list"),
    (chat(messages=[{"role": "robot", "content": "x"}]), "invalid_role", "'robot'"),
    (chat(messages=[{"role": "user", "content": 5}]), "invalid_messages", "content must be"),
    (chat(max_tokens=0), "invalid_parameter", "body.max_tokens must be a positive integer"),
    (chat(max_tokens=2.5), "invalid_parameter", "body.max_tokens"),
    (chat(max_tokens=True), "invalid_parameter", "body.max_tokens"),
    (chat(temperature=-0.1), "invalid_parameter", "body.temperature must be a number >= 0"),
    (chat(temperature="hot"), "invalid_parameter", "body.temperature"),
    (chat(top_p=0), "invalid_parameter", "body.top_p must be a number in (0, 1]"),
    (chat(top_p=1.5), "invalid_parameter", "body.top_p"),
    (chat(top_k=-1), "invalid_parameter", "body.top_k"),
    (chat(seed="x"), "invalid_parameter", "body.seed"),
    (
        json.dumps(
            {
                "custom_id": "a",
                "method": "GET",
                "url": "/v1/chat/completions",
                "body": {"messages": [{"role": "user", "content": "x"}]},
            }
        ),
        "invalid_method",
        "method must be",
    ),
    (
        json.dumps(
            {
                "custom_id": "a",
                "method": "POST",
                "url": "/v1/embeddings",
                "body": {"messages": [{"role": "user", "content": "x"}]},
            }
        ),
        "invalid_url",
        "url must be",
    ),
    (
        json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {}}),
        "invalid_prompt",
        "body.prompt must be a non-empty string",
    ),
    (
        json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/chat/completions"}),
        "invalid_request",
        "body must be a JSON object",
    ),
    (json.dumps({"custom_id": "a", "prompt": ""}), "invalid_prompt", "non-empty string"),
    # Encoding, size, nesting, Unicode and custom_id: each one line's error.
    (b'{"custom_id": "a", "prompt": "caf\xe9"}', "invalid_encoding", "byte 0xe9 at byte 34"),
    (b"\x00\x01\x02\xff\xfe binary", "invalid_encoding", "not UTF-8"),
    (LongLine(20_000_000), "line_too_long", "20000000 bytes, above the limit of 1048576"),
    ('{"custom_id": "a", "prompt": "x", "m": ' + "[" * 70 + "]" * 70 + "}", "too_deep", "64"),
    ("[" * 100_000 + "]" * 100_000, "too_deep", "nested deeper"),
    (
        '{"custom_id": "a", "prompt": "\\ud800"}',
        "invalid_text",
        "lone surrogate ('\\ud800') in prompt",
    ),
    ('{"custom_id": "\\udfff", "prompt": "x"}', "invalid_text", "in custom_id"),
    ('{"custom_id": "a", "prompt": "x", "temperature": NaN}', "invalid_json", "NaN"),
    ('{"custom_id": "a", "prompt": "x", "seed": ' + "9" * 5000 + "}", "invalid_json", "digits"),
    (json.dumps({"custom_id": "x" * 513, "prompt": "p"}), "invalid_custom_id", "513 characters"),
    (json.dumps({"custom_id": "a\u0000b", "prompt": "p"}), "invalid_custom_id", "NUL"),
    # Parameters: unknown, invalid, recognised but not supported by the engine yet.
    (chat(max_token=5), "unknown_parameter", "body.max_token is not a known parameter"),
    (
        json.dumps({"custom_id": "a", "prompt": "x", "temprature": 1}),
        "unknown_parameter",
        "temprature",
    ),
    (
        json.dumps({"custom_id": "a", "prompt": "x", "messages": []}),
        "unknown_parameter",
        "messages is not a field of a prompt line",
    ),
    (chat(n=0), "invalid_parameter", "body.n must be an integer from 1 to 128"),
    (chat(stop=[""]), "invalid_parameter", "body.stop must be"),
    (chat(stop=[[1, -2]]), "invalid_parameter", "body.stop must be"),
    (chat(frequency_penalty=3), "invalid_parameter", "body.frequency_penalty must be"),
    (chat(logit_bias={"a": 1}), "invalid_parameter", "body.logit_bias must be"),
    (chat(logit_bias={"5": 101}), "invalid_parameter", "body.logit_bias must be"),
    (chat(response_format={"type": "xml"}), "invalid_parameter", "body.response_format"),
    (chat(top_logprobs=3), "invalid_parameter", "top_logprobs needs body.logprobs: true"),
    (chat(seed=2**64), "invalid_parameter", "body.seed"),
    (chat(max_tokens=40_000), "invalid_parameter", "above this farm's limit of 32768"),
    (chat(max_tokens=5, max_completion_tokens=6), "invalid_parameter", "disagree"),
    (chat(stream=True), "unsupported_parameter", "body.stream"),
    (chat(tools=[{"type": "function"}]), "unsupported_parameter", "body.tools"),
    (
        chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]),
        "unsupported_parameter",
        "messages[0].content[0] of type 'image_url'",
    ),
    (
        chat(messages=[{"role": "user", "content": "x", "name": "bob"}]),
        "unsupported_parameter",
        "messages[0].name",
    ),
    (chat(messages=[{"role": "user", "content": "x", "mood": 1}]), "invalid_messages", "'mood'"),
    (chat(messages=[{"role": "user", "content": []}]), "invalid_messages", "non-empty array"),
    (chat(messages=[{"role": "tool", "content": "x"}]), "invalid_role", "'tool'"),
    (
        json.dumps(
            {
                "custom_id": "a",
                "method": "POST",
                "url": "/v1/chat/completions",
                "body": {"messages": [{"role": "user", "content": "x"}]},
                "extra": 1,
            }
        ),
        "unknown_parameter",
        "unknown field 'extra'",
    ),
    (
        json.dumps(
            {
                "custom_id": "a",
                "method": "POST",
                "url": "/v1/completions",
                "body": {"prompt": [1, 2, 3]},
            }
        ),
        "unsupported_parameter",
        "body.prompt as token ids",
    ),
    (
        json.dumps(
            {
                "custom_id": "a",
                "method": "POST",
                "url": "/v1/completions",
                "body": {"prompt": ["a", "b"]},
            }
        ),
        "unsupported_parameter",
        "several prompts",
    ),
    (
        json.dumps(
            {
                "custom_id": "a",
                "method": "POST",
                "url": "/v1/completions",
                "body": {"prompt": "x", "echo": True},
            }
        ),
        "unsupported_parameter",
        "body.echo",
    ),
    (
        json.dumps(
            {"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {"messages": []}}
        ),
        "unknown_parameter",
        "body.messages is not a /v1/completions parameter",
    ),
]


@pytest.mark.parametrize(("line", "code", "text"), BAD_LINES)
def test_each_bad_line_gets_its_code_and_line_number(line, code, text):
    lines = [chat("ok1"), "", line, json.dumps({"custom_id": "ok2", "prompt": "hello"})]
    requests, errors = parse_job(lines, model_names={"tiny-random"})
    assert [r.custom_id for r in requests] == ["ok1", "ok2"]
    assert [r.line for r in requests] == [1, 4]
    assert len(errors) == 1
    assert errors[0].code == code
    assert errors[0].line == 3
    assert errors[0].message.startswith("line 3: ")
    assert text in errors[0].message


def test_duplicate_custom_id_names_the_first_line():
    requests, errors = parse_job([chat("a"), chat("b"), chat("a")])
    assert [r.custom_id for r in requests] == ["a", "b"]
    assert errors[0].code == "duplicate_custom_id"
    assert errors[0].message == "line 3: duplicate custom_id 'a' (first used on line 1)"


def test_context_length_uses_the_token_counter():
    lines = [
        json.dumps({"custom_id": "short", "prompt": "x" * 5}),
        json.dumps({"custom_id": "long", "prompt": "x" * 50}),
    ]
    requests, errors = parse_job(lines, count_tokens=lambda r: len(r.prompt), context_length=20)
    assert [r.custom_id for r in requests] == ["short"]
    assert errors[0].code == "context_length_exceeded"
    assert "line 2: prompt is 50 tokens" in errors[0].message
    assert "context of 20 tokens" in errors[0].message


def test_model_names_accept_empty_and_known_names():
    lines = [chat("a", model=""), chat("b", model="tiny-random"), chat("c", model="alias")]
    requests, errors = parse_job(lines, model_names={"tiny-random", "alias"})
    assert len(requests) == 3 and not errors


def test_a_model_the_farm_does_not_serve_runs_on_the_jobs_model_unless_strict():
    lines = [chat("a", model="gpt-4o"), chat("b", model="gpt-3.5-turbo-0125"), chat("c", model=7)]
    aliases = {"gpt-3.5-turbo-0125": "qwen2.5-coder-1.5b", "mini": "tiny-random"}
    requests, errors = parse_job(lines, model_names={"tiny-random"}, aliases=aliases)
    assert [r.custom_id for r in requests] == ["a"]
    assert [(e.line, e.code) for e in errors] == [(2, "model_not_found"), (3, "invalid_request")]
    assert errors[0].message == (
        "line 2: model 'gpt-3.5-turbo-0125' is qwen2.5-coder-1.5b on this farm "
        "(APPLESPEC_MODEL_ALIASES), but this job runs tiny-random"
    )
    strict = [chat("a", model="gpt-4o"), chat("m", model="mini")]
    requests, errors = parse_job(
        strict, model_names={"tiny-random"}, aliases=aliases, strict_models=True
    )
    assert [r.custom_id for r in requests] == ["m"]
    assert errors[0].code == "model_not_found"
    assert errors[0].message == "line 1: unknown model 'gpt-4o' (this job runs tiny-random)"


# The OpenAI Batch guide's example file, unchanged.
OPENAI_EXAMPLE = [
    '{"custom_id": "request-1", "method": "POST", "url": "/v1/chat/completions", "body": '
    '{"model": "gpt-3.5-turbo-0125", "messages": [{"role": "system", "content": "You are a '
    'helpful assistant."},{"role": "user", "content": "Hello world!"}],"max_tokens": 1000}}',
    '{"custom_id": "request-2", "method": "POST", "url": "/v1/chat/completions", "body": '
    '{"model": "gpt-3.5-turbo-0125", "messages": [{"role": "system", "content": "You are an '
    'unhelpful assistant."},{"role": "user", "content": "Hello world!"}],"max_tokens": 1000}}',
]


def test_the_openai_example_file_is_valid_as_it_is():
    requests, errors = parse_job(OPENAI_EXAMPLE, model_names={"smollm2-135m"})
    assert not errors
    assert [r.params["max_tokens"] for r in requests] == [1000, 1000]
    assert requests[0].messages[0] == {"role": "system", "content": "You are a helpful assistant."}


def test_developer_role_content_parts_and_defaults_of_unsupported_fields():
    line = chat(
        "a",
        messages=[
            {"role": "developer", "content": [{"type": "text", "text": "Be terse."}]},
            {
                "role": "user",
                "content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}],
                "name": None,
            },
        ],
        stop=None,
        n=1,
        logprobs=False,
        top_logprobs=0,
        frequency_penalty=0,
        presence_penalty=0.0,
        logit_bias={},
        response_format={"type": "text"},
        stream=False,
        tools=None,
        user="u-1",
        metadata={"k": "v"},
        max_completion_tokens=7,
    )
    (request,), errors = parse_job([line])
    assert not errors
    assert request.messages == [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "one\ntwo"},
    ]
    assert request.params == {**DEFAULT_PARAMS, "max_tokens": 7}


def test_completions_lines_answer_as_text_completions():
    line = json.dumps(
        {
            "custom_id": "c",
            "method": "POST",
            "url": "/v1/completions",
            "body": {"model": "x", "prompt": ["Once upon"], "max_tokens": 4, "logprobs": None},
        }
    )
    (request,), errors = parse_job([line])
    assert not errors and request.prompt == "Once upon" and request.messages is None
    assert request.url == "/v1/completions"
    assert JobRequest.from_dict(request.to_dict()) == request
    body = completion_body("tiny-random", _Result(), created=1, request=request)
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
    assert body["choices"] == [
        {"text": "abc", "index": 0, "logprobs": None, "finish_reason": "length"}
    ]
    old = {"line": 1, "custom_id": "a", "messages": None, "prompt": "p", "params": {}}
    assert JobRequest.from_dict(old).url == "/v1/chat/completions"  # rows stored before urls


def test_one_field_set_says_what_the_engine_supports():
    format_only = {"model", "messages", "prompt", "user", "metadata", "store", "service_tier"}
    assert ENGINE_SUPPORTED - format_only - {"max_completion_tokens"} <= set(PARAMS)
    assert not ENGINE_SUPPORTED & set(OTHER_FIELDS)
    assert not set(PARAMS) & set(OTHER_FIELDS)
    # Every recognised field the engine does not take yet is refused with a value, named.
    for name in sorted(set(PARAMS) - ENGINE_SUPPORTED):
        value = {
            "stop": "x",
            "n": 2,
            "logprobs": True,
            "top_logprobs": 1,
            "logit_bias": {"1": 1},
            "response_format": {"type": "json_object"},
        }.get(name, 0.5)
        body = {name: value, **({"logprobs": True} if name == "top_logprobs" else {})}
        _, errors = parse_job([chat("a", **body)])
        assert errors[0].code == "unsupported_parameter", name
        assert "body." in errors[0].message


def test_completions_logprobs_is_a_count_of_alternatives():
    line = {"custom_id": "a", "method": "POST", "url": "/v1/completions"}
    line["body"] = {"prompt": "x", "logprobs": 2}
    (request,), errors = parse_job([json.dumps(line)])
    assert not errors
    assert request.params["logprobs"] is True and request.params["top_logprobs"] == 2


def test_a_field_the_lead_adds_to_the_set_flows_into_params(monkeypatch):
    monkeypatch.setattr(jobs, "ENGINE_SUPPORTED", ENGINE_SUPPORTED | {"stop", "n"})
    (request,), errors = parse_job([chat("a", stop=["\n\n", [13]], n=3)])
    assert not errors
    assert request.params["stop"] == ["\n\n", [13]] and request.params["n"] == 3


def test_run_request_never_drops_a_parameter_the_engine_lacks(monkeypatch):
    class Engine:
        target = type("T", (), {"encode_prompt": lambda self, p: [1, 2]})()

        def generate(self, tokens, params):
            return params

    request = JobRequest(1, "a", prompt="p")
    assert run_request(Engine(), request).max_tokens == 256
    later = jobs.Param(None, "anything", lambda v, _url: v)  # a field the engine lacks
    monkeypatch.setattr(jobs, "PARAMS", {**jobs.PARAMS, "later": later})
    request.params["later"] = 1
    with pytest.raises(ValueError, match="does not take 'later'"):
        run_request(Engine(), request)


def test_tokenizer_failures_are_per_line_errors():
    import jinja2

    def count(request):
        if request.custom_id == "t":
            raise TypeError("TextEncodeInput must be Union[TextInputSequence, ...]")
        if request.custom_id == "j":
            raise jinja2.TemplateError("Conversation roles must alternate user/assistant")
        return 3

    lines = [chat("ok"), chat("t"), chat("j")]
    requests, errors = parse_job(lines, count_tokens=count, context_length=100)
    assert [r.custom_id for r in requests] == ["ok"]
    assert [(e.line, e.code, e.custom_id) for e in errors] == [
        (2, "tokenizer_error", "t"),
        (3, "chat_template_error", "j"),
    ]
    assert "cannot encode this request (TemplateError: Conversation roles" in errors[1].message


def test_a_broken_check_fails_its_line_only(monkeypatch):
    def broken(model, where, ctx):
        if model == "boom":
            raise RuntimeError("bug")

    monkeypatch.setattr(jobs, "_check_model", broken)
    requests, errors = parse_job([chat("a"), chat("b", model="boom"), chat("c")])
    assert [r.custom_id for r in requests] == ["a", "c"]
    assert errors[0].code == "validation_error"
    assert errors[0].message == "line 2: could not be validated (RuntimeError: bug)"


def test_bad_custom_ids_are_not_kept_and_a_512_character_one_is_fine():
    lines = [
        json.dumps({"custom_id": "x" * 512, "prompt": "p"}),
        json.dumps({"custom_id": "y" * 600, "prompt": "p"}),
        json.dumps({"custom_id": "a\u0000", "prompt": "p"}),
    ]
    requests, errors = parse_job(lines)
    assert [len(r.custom_id) for r in requests] == [512]
    assert [(e.code, e.custom_id) for e in errors] == [
        ("invalid_custom_id", None),
        ("invalid_custom_id", None),
    ]


def test_too_many_lines_refuse_the_whole_file():
    lines = [json.dumps({"custom_id": f"c{i}", "prompt": "p"}) for i in range(4)]
    assert len(parse_job(["", *lines[:3], ""], limits=JobLimits(lines=3))[0]) == 3
    with pytest.raises(JobTooLarge, match="more than 3 requests in one job"):
        parse_job(lines, limits=JobLimits(lines=3))


def test_a_huge_line_is_never_read_whole(tmp_path):
    path = tmp_path / "big.jsonl"
    good = json.dumps({"custom_id": "g", "prompt": "p"}).encode()
    with open(path, "wb") as f:
        f.write(b'{"custom_id": "big", "prompt": "' + b"x" * 8_000_000 + b'"}\r\n')
        f.write(good + b"\r\n\n")
        f.write(b"y" * 1025)  # last line, no newline, one byte past the limit
    limits = JobLimits(line_bytes=1024)
    tracemalloc.start()
    lines = list(iter_job_file(path, limits))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 1_000_000  # the 8 MB line was skipped in small reads
    assert lines == [LongLine(8_000_034), good, b"", LongLine(1025)]
    requests, errors = parse_job(lines, limits=limits)
    assert [r.custom_id for r in requests] == ["g"]
    assert [(e.line, e.code) for e in errors] == [(1, "line_too_long"), (4, "line_too_long")]
    assert errors[0].message == (
        "line 1: the line has 8000034 bytes, above the limit of 1024 (APPLESPEC_MAX_LINE_BYTES)"
    )
    with pytest.raises(JobTooLarge, match="above the limit of 100 .APPLESPEC_MAX_FILE_BYTES"):
        iter_job_file(path, JobLimits(file_bytes=100))


def test_a_raw_surrogate_in_a_text_line_and_brackets_inside_strings():
    raw = '{"custom_id": "a", "prompt": "x \ud800"}'  # the character itself, not an escape
    brackets = json.dumps({"custom_id": "b", "prompt": "[" * 200 + "{" * 200})
    requests, errors = parse_job([raw, brackets])
    assert [r.custom_id for r in requests] == ["b"]  # many brackets, but in a string
    assert errors[0].code == "invalid_text" and "in prompt" in errors[0].message


def test_text_lines_past_the_limit_and_a_byte_order_mark():
    long = json.dumps({"custom_id": "l", "prompt": "é" * 600})  # 1200+ bytes, 600+ chars
    bom = b"\xef\xbb\xbf" + json.dumps({"custom_id": "b", "prompt": "p"}).encode()
    requests, errors = parse_job([bom, long], limits=JobLimits(line_bytes=1024))
    assert [r.custom_id for r in requests] == ["b"]
    assert errors[0].code == "line_too_long"


def test_params_defaults_body_then_overrides():
    lines = [
        chat("a", max_tokens=10, temperature=0.5, top_k=3, seed=1),
        json.dumps({"custom_id": "b", "prompt": "p", "max_tokens": 7}),
    ]
    requests, _ = parse_job(lines, overrides={"max_tokens": 4, "top_p": None})
    assert requests[0].params == {
        **DEFAULT_PARAMS,
        "max_tokens": 4,
        "temperature": 0.5,
        "top_p": 1.0,
        "top_k": 3,
        "seed": 1,
    }
    assert requests[1].params["max_tokens"] == 4
    assert requests[1].prompt == "p" and requests[1].messages is None
    assert JobRequest.from_dict(requests[0].to_dict()) == requests[0]


def test_bad_override_is_a_value_error():
    with pytest.raises(ValueError, match="--top-p must be"):
        parse_job([chat()], overrides={"top_p": 2})
    with pytest.raises(ValueError, match="--max-tokens is 99, above this farm's limit of 50"):
        parse_job([chat()], overrides={"max_tokens": 99}, limits=JobLimits(max_tokens=50))


class _Result:
    tokens = [1, 2, 3]
    text = "abc"
    finish_reason = "length"
    prompt_tokens = 5
    speculative = {"drafter": "ngram", "accepted_tokens": 2}
    timing = {"total_s": 0.5}


def test_output_lines_follow_the_batch_format():
    body = completion_body("tiny-random", _Result(), created=1)
    ok = output_line("batch_abc", 3, "a", body=body)
    assert ok["custom_id"] == "a" and ok["error"] is None
    assert ok["id"] == "batch_req_abc_3" and ok["response"]["request_id"] == "req_abc_3"
    assert ok["response"]["status_code"] == 200
    b = ok["response"]["body"]
    assert b["object"] == "chat.completion" and b["model"] == "tiny-random"
    assert b["choices"] == [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "abc"},
            "logprobs": None,
            "finish_reason": "length",
        }
    ]
    assert b["usage"] == {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
    assert b["speculative"]["drafter"] == "ngram" and b["timing"]["total_s"] == 0.5
    bad = output_line("batch_abc", 1, "x", error={"code": "invalid_json", "message": "line 1: ..."})
    assert bad["response"] is None and bad["error"]["code"] == "invalid_json"


def test_openai_sampling_fields_reach_the_engine():
    """stop, n, logprobs, top_logprobs, penalties and logit_bias are parsed, normalized and
    handed to the engine's GenerationParams."""
    from core.jobs import generation_params

    line = chat(
        stop="\n",
        n=2,
        logprobs=True,
        top_logprobs=3,
        frequency_penalty=0.5,
        presence_penalty=-1,
        logit_bias={"50256": -100},
    )
    (r,), errors = parse_job([line])
    assert errors == []
    p = generation_params(r)
    assert p.stop == ["\n"] and p.n == 2 and p.logprobs and p.top_logprobs == 3
    assert (p.frequency_penalty, p.presence_penalty) == (0.5, -1.0)
    assert p.logit_bias == {"50256": -100.0}
    (r,), _ = parse_job([json.dumps({"custom_id": "a", "prompt": "x", "n": 3, "stop": [[13, 10]]})])
    assert generation_params(r).n == 3 and generation_params(r).stop == [[13, 10]]


def test_the_example_job_files_are_valid_jobs():
    """`run`, `submit` and `bench --input` all take examples/jobs/*.jsonl as they are."""
    from pathlib import Path

    files = sorted((Path(__file__).parents[1] / "examples" / "jobs").glob("*.jsonl"))
    assert len(files) >= 4
    for path in files:
        requests, errors = parse_job(path.read_text().splitlines())
        assert not errors, (path.name, errors[:1])
        assert len(requests) >= 64


def test_response_format_reaches_the_engine_and_bad_schemas_are_per_line_errors():
    """A schema llguidance cannot follow is `invalid_response_format` naming what (checked
    with the tokenizer alone); the other lines, json_object and a good schema, are kept."""
    from core.jobs import generation_params, tokenizer_target, validate_for

    schema = {"type": "object", "properties": {"a": {"enum": ["x", "y"]}}, "required": ["a"]}
    good = {"type": "json_schema", "json_schema": {"name": "g", "schema": schema, "strict": True}}
    lines = [
        chat("obj", response_format={"type": "json_object"}),
        chat("good", response_format=good),
        chat(
            "not", response_format={"type": "json_schema", "json_schema": {"schema": {"not": {}}}}
        ),
        chat(
            "fmt",
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "f", "schema": {"type": "string", "format": "isbn"}},
            },
        ),
        chat("text", response_format={"type": "text"}),
    ]
    requests, errors = validate_for(lines, "tiny-random", tokenizer_target("tiny-random"))
    assert [r.custom_id for r in requests] == ["obj", "good", "text"]
    assert [e.code for e in errors] == ["invalid_response_format"] * 2
    assert "not" in errors[0].message and "isbn" in errors[1].message
    assert generation_params(requests[1]).response_format == good
    assert generation_params(requests[2]).response_format is None
