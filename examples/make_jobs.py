"""Write the benchmark job files (OpenAI Batch JSONL) under examples/jobs/.

Two kinds of work, generated from word lists with a fixed seed so every machine benches the
same lines, each line a different input (and prompt length):

- grounded: labeling, extraction, rewriting and summarising — answers copy from their input
  and share their shape across items (the work a dataset-labeling pipeline sends);
- open: questions, stories, emails and code — little to copy;
- labeling: one task for the whole job, as a labeling pipeline sends it: every line labels
  a different support ticket and every answer is the same JSON shape (the suffix drafter's
  workload: the answers' text recurs across items, not in each item's own prompt);
- labeling-json: the labeling tickets, each line with one `response_format` JSON schema
  (category and urgency enums, the customer's name): structured output's workload.

    python examples/make_jobs.py            # grounded-64/256, open-64, labeling-64, labeling-json-64/256
    python examples/make_jobs.py --kind grounded --items 1000 -o big.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

FIRST = "Maria John Aiko Peter Fatima Lukas Chen Olivia Mateo Priya Noah Elena Omar Sofia Ivan Grace".split()
LAST = "Lopez Smith Tanaka Brown Haddad Weber Wei Johnson Garcia Patel Miller Rossi Ali Costa Petrov Kim".split()
CITIES = "Madrid Boston Osaka Leeds Cairo Munich Shanghai Denver Lima Pune Austin Milan Dubai Porto Kiev Seoul".split()
JOBS = "engineer teacher nurse designer chef pilot lawyer farmer architect dentist".split()
DOMAINS = ["example.com", "example.org", "example.net", "mail.example"]
PRODUCTS = (
    "keyboard mouse monitor webcam headset charger speaker tablet lamp backpack kettle "
    "blender router printer drone camera watch"
).split()
GOOD = [
    "The battery lasts all day and the screen is gorgeous.",
    "Honestly the best purchase I made this year.",
    "Works as described, fast shipping, very happy.",
    "Setup took two minutes and it has worked perfectly since.",
    "Great value for the price, my kids love it.",
    "Sturdy, quiet and much faster than my old one.",
    "Customer service replaced it the next day, impressive.",
    "Beautiful design and the sound is crisp and clear.",
]
BAD = [
    "It broke after two days and support never answered.",
    "Terrible sound quality, I returned it.",
    "The app crashes every time I open it.",
    "Arrived scratched and missing the charging cable.",
    "Way too loud and it overheats after an hour.",
    "Stopped charging within a week, a waste of money.",
    "The buttons feel cheap and two of them already stick.",
    "Instructions were useless and it never connected.",
]
TICKETS = {
    "billing": [
        "I was charged twice for my subscription this month.",
        "My invoice shows the wrong amount.",
        "Please refund the payment from last Tuesday.",
    ],
    "shipping": [
        "My package has not arrived after ten days.",
        "The tracking number does not work.",
        "The parcel was delivered to the wrong address.",
    ],
    "technical": [
        "The device will not turn on after the update.",
        "I cannot log in to the app on my phone.",
        "The screen flickers when I plug in the charger.",
    ],
    "account": [
        "How do I change the email on my account?",
        "I want to delete my account and my data.",
        "I forgot my password and the reset link expired.",
    ],
}
TOPICS = [
    "a lighthouse keeper",
    "a lost dog",
    "a city on Mars",
    "a baker who can fly",
    "two rival chess players",
    "a haunted library",
    "a robot who learns to paint",
    "an old fisherman",
]
QUESTIONS = [
    "What causes the seasons on Earth?",
    "Why is the sky blue?",
    "How do vaccines work?",
    "What is the difference between weather and climate?",
    "How does a refrigerator keep food cold?",
    "Why do we have leap years?",
    "What is photosynthesis?",
    "How do airplanes stay in the air?",
    "What is inflation in economics?",
    "Why does ice float on water?",
    "How do tides work?",
    "What is a black hole?",
]
EMAILS = [
    "ask your manager for a day off next Friday",
    "thank a colleague for helping with a report",
    "invite the team to a lunch on Thursday",
    "ask a supplier for a delivery update",
    "apologise to a customer for a late order",
    "request a meeting with a new client",
]
CODE = [
    "returns the n-th Fibonacci number",
    "checks whether a string is a palindrome",
    "counts the words in a text",
    "merges two sorted lists",
    "removes duplicates from a list keeping order",
    "converts Celsius to Fahrenheit",
    "finds the largest number in a list",
    "reverses the words in a sentence",
]


def person(r: random.Random) -> tuple[str, str, str]:
    f, l_ = r.choice(FIRST), r.choice(LAST)
    return f"{f} {l_}", f"{f.lower()}.{l_.lower()}@{r.choice(DOMAINS)}", r.choice(CITIES)


def grounded(r: random.Random) -> tuple[str, str]:
    kind = r.randrange(8)
    if kind == 0:
        reviews = [r.choice(GOOD + BAD) for _ in range(r.randint(3, 6))]
        lines = "\n".join(f"{i}. {t}" for i, t in enumerate(reviews, 1))
        return "labeling", (
            "Classify each review as positive or negative. Answer with one line per review "
            f"in the form `N: label`.\n{lines}"
        )
    if kind == 1:
        review = r.choice(GOOD + BAD)
        return "labeling", (
            "Copy the review, then add its sentiment (positive or negative) in brackets.\n"
            f"Review: {review}"
        )
    if kind == 2:
        cats = list(TICKETS)
        picks = [r.choice(TICKETS[r.choice(cats)]) for _ in range(r.randint(2, 4))]
        lines = "\n".join(f"- {t}" for t in picks)
        return "labeling", (
            "Label each support ticket with one category: billing, shipping, technical or "
            f"account. Copy each ticket and add `-> category`.\n{lines}"
        )
    if kind == 3:
        people = [person(r) for _ in range(r.randint(1, 3))]
        text = " ".join(
            r.choice(
                [
                    "{n} ({e}) moved to {c} last year.",
                    "{n}, reachable at {e}, lives in {c}.",
                    "Our new hire {n} ({e}) works from {c}.",
                ]
            ).format(n=n, e=e, c=c)
            for n, e, c in people
        )
        return "extraction", (
            "Extract every person's name, email and city from the text as a JSON list of "
            f"objects with keys name, email, city.\nText: {text}"
        )
    if kind == 4:
        rows = [
            (p, f"{r.randint(5, 300)}.{r.choice(['00', '50', '99'])}", r.randint(1, 500))
            for p in r.sample(PRODUCTS, r.randint(3, 6))
        ]
        table = "\n".join(f"{p} | {pr} | {s}" for p, pr, s in rows)
        return "extraction", (
            "Convert this table to JSON, one object per row, keys product, price, stock:\n\n"
            f"product | price | stock\n{table}"
        )
    if kind == 5:
        n, _, c = person(r)
        age, job = r.randint(21, 70), r.choice(JOBS)
        return "extraction", (
            'Fill in this JSON template from the text. Template: {"name": "", "age": "", '
            f'"city": "", "job": ""}}\n\nText: {n} is a {age}-year-old {job} who lives in {c}.'
        )
    if kind == 6:
        n, _, c = person(r)
        p = r.choice(PRODUCTS)
        return "rewriting", (
            "Rewrite this message in a polite, formal tone, keeping every fact:\n\n"
            f"hey, its {n.split()[0]} from {c}. the {p} i bought is broken, send a new one asap."
        )
    n, _, c = person(r)
    units = r.randint(50, 900)
    return "summarising", (
        f"Summarise in one sentence: The city council of {c} approved a plan on Monday to "
        f"convert old parking garages into housing, creating about {units} apartments. "
        f"Council member {n} said construction starts next spring and that a quarter of the "
        "apartments will be reserved for low-income families."
    )


URGENT = [
    "This is urgent, I need it today.",
    "Please help as soon as possible.",
    "No rush, whenever you can.",
    "I have asked three times already.",
    "",
]


def labeling(r: random.Random) -> tuple[str, str]:
    n, e, c = person(r)
    cat = r.choice(list(TICKETS))
    text = " ".join(t for t in (r.choice(TICKETS[cat]), f"I live in {c}.", r.choice(URGENT)) if t)
    return "labeling", (
        "Label the support ticket. Answer with a JSON object only, with the keys "
        '"category" (billing, shipping, technical or account), "urgency" (low, medium or '
        'high) and "customer" (the first name of the customer).\n\n'
        f"Ticket from {n} <{e}>: {text}"
    )


# labeling-json: the labeling job with OpenAI structured output, one schema for every line.
LABEL_SCHEMA = {
    "type": "object",
    "properties": {
        "category": {"enum": ["billing", "shipping", "technical", "account"]},
        "urgency": {"enum": ["low", "medium", "high"]},
        "customer": {"type": "string", "minLength": 1, "maxLength": 24},
    },
    "required": ["category", "urgency", "customer"],
    "additionalProperties": False,
}
LABEL_FORMAT = {
    "type": "json_schema",
    "json_schema": {"name": "ticket_label", "schema": LABEL_SCHEMA, "strict": True},
}


def open_prompt(r: random.Random) -> tuple[str, str]:
    kind = r.randrange(4)
    if kind == 0:
        return "qa", f"{r.choice(QUESTIONS)} Answer briefly."
    if kind == 1:
        return "story", f"Write a short story about {r.choice(TOPICS)} in {r.choice(CITIES)}."
    if kind == 2:
        return "email", f"Write a short email to {r.choice(FIRST)} to {r.choice(EMAILS)}."
    return "code", f"Write a Python function that {r.choice(CODE)}, with a docstring."


def job_lines(kind: str, items: int, seed: int = 0, max_tokens: int = 96) -> list[str]:
    structured = kind == "labeling-json"
    if structured:
        kind = "labeling"  # the same tickets as labeling-N, each line with LABEL_FORMAT
    r = random.Random(f"{kind}-{seed}")
    make = {"grounded": grounded, "open": open_prompt, "labeling": labeling}[kind]
    out = []
    for i in range(items):
        category, text = make(r)
        body = {
            "model": "smollm2-135m",
            "messages": [{"role": "user", "content": text}],
            "max_tokens": max_tokens,
            "temperature": 0,
            "metadata": {"category": category},  # OpenAI's free-form body field
        }
        if structured:
            body["response_format"] = LABEL_FORMAT
        line = {
            "custom_id": f"{'labeling-json' if structured else kind}-{i + 1}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": body,
        }
        out.append(json.dumps(line))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kind", choices=["grounded", "open", "labeling", "labeling-json"])
    ap.add_argument("--items", type=int)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("-o", "--output")
    a = ap.parse_args()
    here = Path(__file__).resolve().parent / "jobs"
    wanted = (
        [(a.kind, a.items or 64, a.output)]
        if a.kind
        else [
            ("grounded", 64, None),
            ("grounded", 256, None),
            ("open", 64, None),
            ("labeling", 64, None),
            ("labeling-json", 64, None),
            ("labeling-json", 256, None),
        ]
    )
    for kind, items, out in wanted:
        path = Path(out) if out else here / f"{kind}-{items}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(job_lines(kind, items, max_tokens=a.max_tokens)) + "\n")
        print(path)


if __name__ == "__main__":
    main()
