"""The job file format: every bad-line class, overrides, and the output line shape."""

import json

import pytest

from core.jobs import JobRequest, completion_body, output_line, parse_job


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
    (chat(model="gpt-4o"), "model_not_found", "unknown model 'gpt-4o'"),
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
        json.dumps({"custom_id": "a", "method": "POST", "url": "/v1/chat/completions"}),
        "invalid_request",
        "body must be a JSON object",
    ),
    (json.dumps({"custom_id": "a", "prompt": ""}), "invalid_prompt", "non-empty string"),
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


def test_params_defaults_body_then_overrides():
    lines = [
        chat("a", max_tokens=10, temperature=0.5, top_k=3, seed=1),
        json.dumps({"custom_id": "b", "prompt": "p", "max_tokens": 7}),
    ]
    requests, _ = parse_job(lines, overrides={"max_tokens": 4, "top_p": None})
    assert requests[0].params == {
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
        {"index": 0, "message": {"role": "assistant", "content": "abc"}, "finish_reason": "length"}
    ]
    assert b["usage"] == {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
    assert b["speculative"]["drafter"] == "ngram" and b["timing"]["total_s"] == 0.5
    bad = output_line("batch_abc", 1, "x", error={"code": "invalid_json", "message": "line 1: ..."})
    assert bad["response"] is None and bad["error"]["code"] == "invalid_json"
