#!/usr/bin/env python3
"""Renders the templates and conversations of
tests/data/chat_templates/expected.json (written by render.mjs with
@huggingface/jinja) again with Python's Jinja2, set up as Hugging Face
transformers sets it up for apply_chat_template (sandboxed, trim_blocks,
lstrip_blocks, raise_exception), and records in expected.json each
rendering where the two engines disagree: "jinja2_text" or "jinja2_error"
beside the JavaScript engine's result. kvferry follows Jinja2 there (it is
what transformers, vLLM and TGI run).

Usage: node tools/chatref/render.mjs && python3 tools/chatref/render_jinja2.py
"""
import json
import os
import sys

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "..", "tests", "data", "chat_templates")


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def main():
    path = os.path.join(DATA, "expected.json")
    with open(path, encoding="utf-8") as f:
        ref = json.load(f)
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    templates = {t["name"]: t for t in ref["templates"]}
    conversations = {c["name"]: c for c in ref["conversations"]}
    compiled = {}
    differ = 0
    for r in ref["renderings"]:
        r.pop("jinja2_text", None)
        r.pop("jinja2_error", None)
        t = templates[r["template"]]
        if t["name"] not in compiled:
            with open(os.path.join(DATA, t["name"] + ".jinja"), encoding="utf-8") as f:
                compiled[t["name"]] = env.from_string(f.read())
        variables = {"messages": conversations[r["conversation"]]["messages"],
                     "add_generation_prompt": True}
        for key in ("bos_token", "eos_token"):
            if t[key] is not None:
                variables[key] = t[key]
        try:
            got = {"text": compiled[t["name"]].render(**variables)}
        except jinja2.exceptions.TemplateError as e:
            got = {"error": str(e)}
        if got.get("text") != r.get("text") or got.get("error") != r.get("error"):
            differ += 1
            for key, value in got.items():
                r["jinja2_" + key] = value
    ref["jinja2_engine"] = "Jinja2 " + jinja2.__version__
    with open(path, "w", encoding="utf-8") as f:
        f.write(json.dumps(ref, ensure_ascii=False, indent=1) + "\n")
    print(f"{len(ref['renderings'])} renderings, {differ} where Jinja2 differs", file=sys.stderr)


if __name__ == "__main__":
    main()
