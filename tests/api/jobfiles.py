"""Job files for CLI tests: good lines and one line of every bad class."""

import json


def chat(custom_id, content="hello", **body):
    body.setdefault("messages", [{"role": "user", "content": content}])
    return json.dumps(
        {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}
    )


GOOD = [
    chat("g1", max_tokens=6),
    json.dumps({"custom_id": "g2", "prompt": "Once upon a time", "max_tokens": 5}),
    chat("g3", model="tiny-random", temperature=0.7, top_p=0.9, seed=3),
]

# (line, error code) for every class of bad line; with the tiny model (context 4096).
BAD = [
    ("{not json", "invalid_json"),
    ('"a string"', "invalid_request"),
    (json.dumps({"prompt": "x"}), "missing_custom_id"),
    (chat("g1"), "duplicate_custom_id"),
    (chat("m1", messages=[]), "invalid_messages"),
    (chat("m2", messages=[{"role": "robot", "content": "x"}]), "invalid_role"),
    (chat("m3", messages=[{"role": "user", "content": ["x"]}]), "invalid_messages"),
    (chat("p1", max_tokens=-3), "invalid_parameter"),
    (chat("p2", temperature=-1), "invalid_parameter"),
    (chat("p3", top_p=1.5), "invalid_parameter"),
    (
        json.dumps(
            {
                "custom_id": "u1",
                "method": "GET",
                "url": "/v1/chat/completions",
                "body": {"messages": [{"role": "user", "content": "x"}]},
            }
        ),
        "invalid_method",
    ),
    (
        json.dumps(
            {
                "custom_id": "u2",
                "method": "POST",
                "url": "/v1/embeddings",
                "body": {"messages": [{"role": "user", "content": "x"}]},
            }
        ),
        "invalid_url",
    ),
    (chat("long", content="x" * 5000), "context_length_exceeded"),
    (
        chat(
            "st",
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "s", "schema": {"type": "object", "not": {}}},
            },
        ),
        "invalid_response_format",
    ),
    (chat("cid", custom_id_is="x"), "unknown_parameter"),
]


def write_job(path, lines):
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def mixed_lines():
    """Good and bad lines interleaved, with a blank line; returns (lines, {line_no: code})."""
    lines, expected = [], {}
    lines.append(GOOD[0])
    lines.append("")
    for i, (bad, code) in enumerate(BAD):
        lines.append(bad)
        expected[len(lines)] = code
        if i == 5:
            lines.append(GOOD[1])
    lines.append(GOOD[2])
    return lines, expected


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]
