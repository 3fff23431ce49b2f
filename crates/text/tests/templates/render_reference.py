#!/usr/bin/env python3
"""Renders the chat templates of this folder as transformers renders them (its own compiled
Jinja environment, `transformers.utils.chat_template_utils`), for the conversations in
`conversations.json`, into `<template>.<conversation>.txt`: the expected text of
crates/text/tests/jinja_template.rs. "Current date" lines are written as YYYY-MM-DD (the test
puts today's date there). CI never runs this (it needs transformers). Usage:
  /tmp/moevenv/bin/python crates/text/tests/templates/render_reference.py
"""
import json
from pathlib import Path

from transformers.utils.chat_template_utils import _compile_jinja_template

HERE = Path(__file__).resolve().parent


def main():
    conversations = json.loads((HERE / "conversations.json").read_text())
    for template in sorted(HERE.glob("*.jinja")):
        compiled = _compile_jinja_template(template.read_text())
        for name, c in conversations.items():
            text = compiled.render(
                messages=c["messages"],
                tools=c.get("tools"),
                add_generation_prompt=c["add_generation_prompt"],
                **c.get("kwargs", {}),
            )
            lines = [("Current date: YYYY-MM-DD" if l.startswith("Current date: ") else l)
                     for l in text.split("\n")]
            out = HERE / f"{template.stem}.{name}.txt"
            out.write_text("\n".join(lines))
            print("wrote", out)


if __name__ == "__main__":
    main()
